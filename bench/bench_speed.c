/* bench_speed.c — replay at the hardware's speed (`make bench`): the machine's measured ceilings (vector FMA peak
 * per instruction set, per core and on all cores; streaming-read bandwidth), the attention kernels against them
 * (the full causal reference for a block of decode steps, attention over a selection S_t), each beside the naive
 * scalar row-by-row path, and a policy sweep (10 policies x 8 budgets) with every FMA it performs counted against
 * the peak, at 2048 positions and (a full run) again at 8192, the length users sweep, twice: after a long prompt,
 * and with the decode steps whose pairs match a users' sweep of Llama-3.1-8B. sim/BENCH.md explains the floors
 * and the readings.
 * Data: GENERATED Gaussian q/k/v with the shapes of Llama-family models (d 64 and 128, 4 query heads per KV
 * head), labelled as such; not a model's numbers. Timed figures are never asserted; each section prints the load
 * average when it starts (the machine is shared).
 * Arguments (optional): `kernels` or `sweep` runs only that part after the ceilings (for profiling); `sweep POLICY`
 * the sweep of one policy; KVSIM_BENCH_SWEEP_SCALE, _DECODE and _REPS shape it (below).
 * KVSIM_BENCH_NPY_DIR (optional; bench/run_bench.sh sets it when python3 has torch): also replays
 * full/window/streaming/topk alone on the sweep's trace, timed, and writes the trace arrays and kvsim's per-layer
 * output errors there for bench/torch_replay.py's side-by-side run.
 * KVSIM_BENCH_KV16_ONLY (optional): stop after the 16-bit K/V part (kernels over fp16 against fp32 in and out of
 * cache, the replay with a 16-bit history against the fp32 one), before the sweep.
 * `codec [POLICY]` (and the end of a full run): a KV codec's cost, POLICY's (default h2o) 8 budgets at the
 * 8192-position shape without a codec, with int:bits=4 and with kivi (sim/BENCH.md "A codec's cost").
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/kvs.h"
#include "../common/kvs_math.h"
#include "../common/kvs_math_simd.h"
#include "../common/kvs_math_simd_f64.h"
#include "../common/kvs_peak.h"
#include "../common/npy.h"
#include "../sim/codec.h"
#include "../sim/policy.h"
#include "../policies/registry.h"
#include "../sim/replay.h"
#include "../sim/replay_mem.h"
#include "../tests/util/gen_trace.h"
#include "../tests/util/replay_fixture.h"

#define CHECK(x)                                                                      \
    do {                                                                              \
        kvs_status st_ = (x);                                                         \
        if (st_ != KVS_OK) {                                                          \
            fprintf(stderr, "bench_speed: %s: %s\n", #x, kvs_last_error());           \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static void print_load(const char *what) {
    FILE *f = fopen("/proc/loadavg", "r");
    char line[128] = "?";
    if (f) {
        if (!fgets(line, sizeof line, f)) snprintf(line, sizeof line, "?\n");
        fclose(f);
    }
    printf("-- %s (load average: %.*s)\n", what, (int)strcspn(line, "\n"), line);
}

/* CPU seconds of this thread (`thread` != 0) or of the whole process: on the shared machine other developers'
 * load slows the wall clock but not the CPU time a kernel needs, so the kernels are timed in thread CPU time and
 * the sweep reports both. */
static double cpu_s(int thread) {
    struct timespec ts;
    clock_gettime(thread ? CLOCK_THREAD_CPUTIME_ID : CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* ---- the machine ---- */

static double peak_core, peak_all; /* best instruction set, FMA/s */
static double peak_core_cpu;       /* the same per core, per CPU second (the yardstick of CPU-timed figures) */
static double bw_core, bw_all;     /* bytes/s */

static void machine(int threads) {
    print_load("machine");
    printf("%-10s %16s %16s\n", "isa", "FMA/s 1 core", "FMA/s all cores");
    for (int i = 0; i < KVS_PEAK_COUNT; i++) {
        if (!kvs_peak_isa_available((kvs_peak_isa)i)) {
            printf("%-10s %16s %16s  (not on this CPU)\n", kvs_peak_isa_name((kvs_peak_isa)i), "-", "-");
            continue;
        }
        double w0 = kvs_now_s(), c0 = cpu_s(0);
        double one = kvs_peak_fma((kvs_peak_isa)i, 1, 0.3);
        double one_cpu = one * (kvs_now_s() - w0) / (cpu_s(0) - c0); /* the loop's FMAs per CPU second */
        double all = kvs_peak_fma((kvs_peak_isa)i, threads, 0.3);
        if (one_cpu > peak_core_cpu) peak_core_cpu = one_cpu;
        printf("%-10s %16.3g %16.3g\n", kvs_peak_isa_name((kvs_peak_isa)i), one, all);
        if (one > peak_core) peak_core = one;
        if (all > peak_all) peak_all = all;
    }
    bw_core = kvs_peak_read_bandwidth((size_t)256 << 20, 1, 3);
    bw_all = kvs_peak_read_bandwidth((size_t)256 << 20, threads, 3);
    printf("peak (best isa): %.3g FMA/s per core, %.3g on %d cores; streaming read of 256 MiB: %.3g GB/s on 1 "
           "core, %.3g GB/s on %d cores\n",
           peak_core, peak_all, threads, bw_core / 1e9, bw_all / 1e9, threads);
    printf("per core in CPU time (the yardstick of the CPU-timed kernels and sweep below): %.3g FMA per CPU s\n",
           peak_core_cpu);
    printf("kvs_math kernels in use: %s (KVS_SIMD=scalar forces the reference)", kvs_math_isa_name(kvs_math_isa_active()));
    if (kvs_math_fma512_speedup() > 0)
        printf("; the selection's probe: 512-bit FMAs at %.2fx the 256-bit lanes per second", kvs_math_fma512_speedup());
    printf("\n");
}

/* ---- kernels (1 core) ---- */

/* The naive path, the yardstick of the kernels: row by row through the scalar table, each query row reading
 * every K/V row. */
static void attention_rows_scalar(const float *q, size_t nrows, size_t G, const float *k, const float *v, size_t d,
                                  const int32_t *idx, const size_t *len, float *p, float *out) {
    const kvs_math_kernels *s = kvs_math_kernels_for(KVS_ISA_SCALAR);
    for (size_t r = 0; r < nrows; r++) {
        size_t n = len[r / G];
        s->scores(q + r * d, 1, k, d, idx, n, d, 1.0f / sqrtf((float)d), &p, 0);
        s->softmax(p, n);
        memset(out, 0, d * sizeof *out);
        const float *pc = p;
        s->output_add(&pc, 1, 0, v, d, idx, n, d, &out);
    }
}

static void kernels(int d) {
    const size_t G = 4, N = 4096, nb = 8, p0 = N - nb, budget = 1024;
    uint64_t seed = 7;
    /* K and V in one block from kvs_alloc_rows, as the replay holds a layer's history (on huge pages where the
     * system has them; a selection's scattered rows are TLB misses on 4 KiB pages) */
    float *k = kvs_alloc_rows(2 * N * (size_t)d * sizeof *k), *v = k ? k + N * (size_t)d : NULL;
    float *q = malloc(nb * G * (size_t)d * sizeof *q), *pb = malloc(nb * G * N * sizeof *pb);
    float *ob = malloc(nb * G * (size_t)d * sizeof *ob);
    int32_t *idx = malloc(budget * sizeof *idx);
    if (!k || !v || !q || !pb || !ob || !idx) exit(1);
    for (size_t i = 0; i < N * (size_t)d; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    for (size_t i = 0; i < nb * G * (size_t)d; i++) q[i] = frand(&seed);
    /* S_t as top-k-like policies select it: `budget` distinct positions drawn at random, ascending */
    {
        unsigned char *taken = calloc(N, 1);
        if (!taken) exit(1);
        for (size_t c = 0; c < budget;) {
            size_t x = (size_t)((frand(&seed) + 1.0f) * 0.5f * (float)N) % N;
            if (!taken[x]) taken[x] = 1, c++;
        }
        for (size_t x = 0, c = 0; x < N; x++)
            if (taken[x]) idx[c++] = (int32_t)x;
        free(taken);
    }
    int32_t idx_l2[256]; /* 256 of them, as random (every 4th of the ascending 1024) */
    for (size_t j = 0; j < 256; j++) idx_l2[j] = idx[(4 * j) % budget];
    int32_t *idx_rand = malloc(budget * sizeof *idx_rand); /* kept: the lines below reuse idx */
    if (!idx_rand) exit(1);
    memcpy(idx_rand, idx, budget * sizeof *idx);
    float *prow[32], *orow[32];
    for (size_t r = 0; r < nb * G; r++) prow[r] = pb + r * N, orow[r] = ob + r * (size_t)d;
    size_t len[8];
    double fma_ref = 0;
    for (size_t b = 0; b < nb; b++) len[b] = p0 + b + 1, fma_ref += 2.0 * (double)d * (double)G * (double)len[b];
    double fma_sel = 2.0 * (double)d * (double)G * (double)budget;
    /* floors: the reference reads each K/V row once per block (blocked), the old path once per query row */
    double bytes_block = 2.0 * (double)N * d * 4, bytes_rows = bytes_block * (double)(nb * G);
    double t0, el, reps;
    printf("d %d, G %zu, %zu positions, block of %zu decode steps (%zu query rows), |S_t| %zu (thread CPU time):\n", d,
           G, N, nb, nb * G, budget);
    printf("  %-36s %12s %14s %10s %16s\n", "kernel", "FMA/s", "of 1-core peak", "GB/s", "mem floor s/FMA");
/* Repetitions in batches that double, the clock read once a batch: a thread CPU-time read is a system call (about
 * 0.5 us on the development VM), which read after every call understated the short calls' rates by up to a fifth. */
#define TIMED(EXPR)                                                                                             \
    reps = 0;                                                                                                   \
    t0 = cpu_s(1);                                                                                              \
    for (long batch_ = 1;; batch_ *= 2) {                                                                       \
        for (long b_ = 0; b_ < batch_; b_++) {                                                                  \
            EXPR;                                                                                               \
        }                                                                                                       \
        reps += (double)batch_;                                                                                 \
        if ((el = cpu_s(1) - t0) >= 0.25) break;                                                                \
    }
    TIMED(attention_rows_scalar(q, nb * G, G, k, v, (size_t)d, NULL, len, pb, ob));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "full reference, rows, scalar (before)", reps * fma_ref / el,
           100 * reps * fma_ref / el / peak_core_cpu, reps * bytes_rows / el / 1e9, bytes_rows / bw_core / fma_ref);
    TIMED(kvs_attention_causal_block(q, nb, G, k, v, (size_t)d, p0, 1.0f / sqrtf((float)d), prow, orow, NULL, NULL));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "full reference, blocked (after)", reps * fma_ref / el,
           100 * reps * fma_ref / el / peak_core_cpu, reps * bytes_block / el / 1e9, bytes_block / bw_core / fma_ref);
    size_t blen[1] = {budget};
    double bytes_sel = 2.0 * (double)budget * d * 4;
    TIMED(attention_rows_scalar(q, G, G, k, v, (size_t)d, idx, blen, pb, ob));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t, per query head, scalar (before)", reps * fma_sel / el,
           100 * reps * fma_sel / el / peak_core_cpu, reps * bytes_sel * (double)G / el / 1e9,
           bytes_sel * (double)G / bw_core / fma_sel);
    TIMED(kvs_attention_group(q, G, k, v, (size_t)d, idx, budget, (size_t)d, 1.0f / sqrtf((float)d), prow, ob, NULL));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t, G heads at once (after)", reps * fma_sel / el,
           100 * reps * fma_sel / el / peak_core_cpu, reps * bytes_sel / el / 1e9, bytes_sel / bw_core / fma_sel);
    /* The softmax's part of that call: the G rows' softmax alone, on the call's own scores (each rep restores them
     * from a copy; the copies are timed apart and taken off). No FMA is counted for it. */
    {
        double call_s = el / reps, sm_s, copy_s;
        float *saved = malloc(G * budget * sizeof *saved);
        if (!saved) exit(1);
        for (size_t r = 0; r < G; r++) memcpy(saved + r * budget, prow[r], budget * sizeof *saved);
        const kvs_math_kernels *km = kvs_math_kernels_active();
        TIMED(for (size_t r = 0; r < G; r++) {
            memcpy(prow[r], saved + r * budget, budget * sizeof *saved);
            km->softmax(prow[r], budget);
        });
        sm_s = el / reps;
        TIMED(for (size_t r = 0; r < G; r++) memcpy(prow[r], saved + r * budget, budget * sizeof *saved));
        copy_s = el / reps;
        sm_s = sm_s > copy_s ? sm_s - copy_s : 0;
        printf("  %-36s %9.3g ns per element, %.1f%% of the S_t call above\n", "  of which softmax (G rows alone)",
               1e9 * sm_s / (double)(G * budget), 100 * sm_s / call_s);
        free(saved);
    }
    /* S_t as a window selects it: the last `budget` positions, contiguous */
    for (size_t j = 0; j < budget; j++) idx[j] = (int32_t)(N - budget + j);
    TIMED(kvs_attention_group(q, G, k, v, (size_t)d, idx, budget, (size_t)d, 1.0f / sqrtf((float)d), prow, ob, NULL));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t, G heads at once, a window", reps * fma_sel / el,
           100 * reps * fma_sel / el / peak_core_cpu, reps * bytes_sel / el / 1e9, bytes_sel / bw_core / fma_sel);
    /* every 4th position: rows 4 * d * 4 bytes apart, a power of two, so their
     * cache lines crowd into a quarter (d 64) or an eighth (d 128) of L1's sets and evict each other */
    for (size_t j = 0; j < budget; j++) idx[j] = (int32_t)(4 * j);
    TIMED(kvs_attention_group(q, G, k, v, (size_t)d, idx, budget, (size_t)d, 1.0f / sqrtf((float)d), prow, ob, NULL));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t, G heads, every 4th (aliasing)", reps * fma_sel / el,
           100 * reps * fma_sel / el / peak_core_cpu, reps * bytes_sel / el / 1e9, bytes_sel / bw_core / fma_sel);
    /* the same kernel on a selection whose rows stay in L2 (256 random rows: 2 x 128 KiB at d 128): the lines
     * above read 1024 rows (2 x 512 KiB at d 128, L2's 1 MiB with the queries and probabilities) */
    enum { SEL_L2 = 256 };
    for (size_t j = 0; j < SEL_L2; j++) idx[j] = idx_l2[j];
    double fma_l2 = 2.0 * (double)d * (double)G * SEL_L2, bytes_l2 = 2.0 * SEL_L2 * d * 4;
    TIMED(kvs_attention_group(q, G, k, v, (size_t)d, idx, SEL_L2, (size_t)d, 1.0f / sqrtf((float)d), prow, ob, NULL));
    printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t, G heads at once, |S_t| 256 (L2)", reps * fma_l2 / el,
           100 * reps * fma_l2 / el / peak_core_cpu, reps * bytes_l2 / el / 1e9, bytes_l2 / bw_core / fma_l2);
    /* What a sweep's policies run at a measured step (sim/BENCH.md "Scores from the reference"): S_t's scores
     * gathered from the reference's row, each head's softmax, the output; FMAs counted: the output's d per pair. The random 1024 of
     * the lines above. */
    {
        float *srow_mem = malloc(G * N * sizeof *srow_mem);
        if (!srow_mem) exit(1);
        memcpy(idx, idx_rand, budget * sizeof *idx);
        for (size_t i = 0; i < G * N; i++) srow_mem[i] = 4.0f * frand(&seed);
        const float *srow[4];
        for (size_t g = 0; g < G; g++) srow[g] = srow_mem + g * N;
        double fma_out = (double)d * (double)G * (double)budget, bytes_v = (double)budget * d * 4;
        TIMED(kvs_attention_group_scored(srow, G, v, NULL, KVS_DTYPE_F32, (size_t)d, idx, budget, (size_t)d, prow, ob));
        printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "S_t from the reference's scores", reps * fma_out / el,
               100 * reps * fma_out / el / peak_core_cpu, reps * bytes_v / el / 1e9, bytes_v / bw_core / fma_out);
        /* and on the 256 rows that stay in L2, where the softmax's share shows */
        double fma_out_l2 = (double)d * (double)G * SEL_L2, bytes_v_l2 = (double)SEL_L2 * d * 4;
        TIMED(kvs_attention_group_scored(srow, G, v, NULL, KVS_DTYPE_F32, (size_t)d, idx_l2, SEL_L2, (size_t)d, prow,
                                         ob));
        printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "  the same, |S_t| 256 (L2)", reps * fma_out_l2 / el,
               100 * reps * fma_out_l2 / el / peak_core_cpu, reps * bytes_v_l2 / el / 1e9,
               bytes_v_l2 / bw_core / fma_out_l2);
        /* One query head's output over its own list: the call a per-query-head selection makes when its lists'
         * union is refused (sim/BENCH.md "Per-query-head lists"); the output kernel alone, one row */
        {
            const kvs_math_kernels *km = kvs_math_kernels_active();
            const float *p1 = prow[0];
            TIMED(km->output_add(&p1, 1, 0, v, (size_t)d, idx_rand, budget, (size_t)d, orow));
            printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "output, one row over its list",
                   reps * fma_out / (double)G / el, 100 * reps * fma_out / (double)G / el / peak_core_cpu,
                   reps * bytes_v / el / 1e9, bytes_v / bw_core / (fma_out / (double)G));
            TIMED(km->output_add(&p1, 1, 0, v, (size_t)d, idx_l2, SEL_L2, (size_t)d, orow));
            printf("  %-36s %12.3g %13.1f%% %10.2f %16.3g\n", "  the same, |S_t| 256 (L2)",
                   reps * fma_out_l2 / (double)G / el, 100 * reps * fma_out_l2 / (double)G / el / peak_core_cpu,
                   reps * bytes_v_l2 / el / 1e9, bytes_v_l2 / bw_core / (fma_out_l2 / (double)G));
        }
        /* KeyDiff's eviction scores at a decode step (fp64: the anchor over the held keys, then each key's
         * cosine to it; POLICY_SPEC §2.5): the same 1024 keys, their norms known */
        double *norm = malloc(budget * sizeof *norm), *score = malloc(budget * sizeof *score);
        double *work = malloc(((size_t)d + 1) * sizeof *work);
        if (!norm || !score || !work) exit(1);
        kvs_key_norms(k, (size_t)d, idx, budget, (size_t)d, norm);
        TIMED(kvs_key_scores_normed(k, (size_t)d, idx, budget, (size_t)d, KVS_KEY_SCORE_ANCHOR, norm, score, work));
        printf("  %-36s %9.3g ns per key (2 x %d fp64 multiply-adds a key)\n", "KeyDiff anchor + cosines (fp64)",
               1e9 * el / reps / (double)budget, d);
        /* and what a decode step runs: the one key to evict, the cosines screened in fp32 and only the keys the
         * screen's bound cannot rule out scored in fp64 (kvs_key_scores_lowest), the anchor still in fp64 */
        void *lowest_scratch = malloc(kvs_key_scores_lowest_scratch_bytes(budget, (size_t)d));
        if (!lowest_scratch) exit(1);
        volatile int64_t lowest = 0;
        TIMED(lowest = kvs_key_scores_lowest(k, (size_t)d, idx, budget, budget, (size_t)d, KVS_KEY_SCORE_ANCHOR, norm,
                                             score, lowest_scratch, NULL, NULL));
        (void)lowest;
        printf("  %-36s %9.3g ns per key (fp64 anchor, fp32 screen of the cosines)\n", "KeyDiff one eviction",
               1e9 * el / reps / (double)budget);
        free(lowest_scratch);
        /* The replay's attention recall and top-k hits of 4 query heads over S_t (sim/replay.c recall_sums, per
         * measured step and KV head): the random 1024, each head's probabilities and ranks a row of N */
        int32_t *rank = malloc(G * N * sizeof *rank);
        if (!rank) exit(1);
        for (size_t i = 0; i < G * N; i++) rank[i] = (int32_t)(i % N) ^ (int32_t)(i / N);
        const float *fpl[4];
        const int32_t *lists[4], *ranks[4];
        int64_t lens[4];
        double rsum[4];
        int64_t hits[4];
        for (size_t g = 0; g < 4; g++)
            fpl[g] = srow_mem + g * N, lists[g] = idx_rand, ranks[g] = rank + g * N, lens[g] = (int64_t)budget;
        for (int vec = 0; vec < 2; vec++) {
            const kvs_math_f64_kernels *kf = vec ? kvs_math_f64_kernels_active() : kvs_math_f64_kernels_for(KVS_ISA_SCALAR);
            TIMED(kf->recall4(4, fpl, lists, ranks, lens, rsum, hits));
            printf("  %-36s %9.3g ns per entry (fp64 sum + rank compare; %s table)\n",
                   vec ? "  the same, vector" : "recall + top-k hits, 4 heads", 1e9 * el / reps / (double)(4 * budget),
                   kf->name);
        }
        free(rank);
        free(norm);
        free(score);
        free(work);
        free(srow_mem);
    }
    free(idx_rand);
#undef TIMED
    free(k);
    free(q);
    free(pb);
    free(ob);
    free(idx);
}

/* ---- the same kernels over K/V kept in 16 bits (fp16) against fp32 (1 core) ----
 * Two contexts per head_dim: one whose K/V (fp32) stay in the caches (2048 positions: 1 MiB at d 64, 2 MiB at d
 * 128) and one that does not (32768 positions: 16 / 32 MiB in fp32, half that in fp16; the VM has 1 MiB of L2
 * per core and a 32 MiB L3 shared with the other guests). "B/FMA" is the K/V bytes each pass reads per FMA. */
static void kernels16(int d, size_t N) {
    const size_t G = 4, nb = 8, p0 = N - nb, budget = N / 4;
    uint64_t seed = 11;
    size_t nd = N * (size_t)d;
    float *k = kvs_alloc_rows(2 * nd * sizeof *k), *v = k ? k + nd : NULL; /* as the replay holds them */
    uint16_t *k16 = kvs_alloc_rows(2 * nd * sizeof *k16), *v16 = k16 ? k16 + nd : NULL;
    float *q = malloc(nb * G * (size_t)d * sizeof *q), *pb = malloc(nb * G * N * sizeof *pb);
    float *ob = malloc(nb * G * (size_t)d * sizeof *ob);
    int32_t *idx = malloc(budget * sizeof *idx);
    if (!k || !v || !k16 || !v16 || !q || !pb || !ob || !idx) exit(1);
    for (size_t i = 0; i < nd; i++) k[i] = frand(&seed), v[i] = frand(&seed);
    kvs_encode(KVS_DTYPE_F16, k, nd, k16);
    kvs_encode(KVS_DTYPE_F16, v, nd, v16);
    kvs_decode(KVS_DTYPE_F16, k16, nd, k); /* the fp32 rows are the exact conversion, as in the replay */
    kvs_decode(KVS_DTYPE_F16, v16, nd, v);
    for (size_t i = 0; i < nb * G * (size_t)d; i++) q[i] = frand(&seed);
    for (size_t j = 0; j < budget; j++) idx[j] = (int32_t)(4 * j + (j % 4)); /* a quarter of the rows, spread */
    float *prow[32], *orow[32];
    for (size_t r = 0; r < nb * G; r++) prow[r] = pb + r * N, orow[r] = ob + r * (size_t)d;
    double fma_ref = 0, fma_sel = 2.0 * (double)d * (double)G * (double)budget;
    for (size_t b = 0; b < nb; b++) fma_ref += 2.0 * (double)d * (double)G * (double)(p0 + b + 1);
    double elems_ref = 2.0 * (double)N * d, elems_sel = 2.0 * (double)budget * d; /* K and V elements read */
    float scale = 1.0f / sqrtf((float)d);
    double t0, el, reps;
#define TIMED(EXPR)                                                                                             \
    reps = 0;                                                                                                   \
    t0 = kvs_now_s();                                                                                           \
    do {                                                                                                        \
        EXPR;                                                                                                   \
        reps++;                                                                                                 \
    } while ((el = kvs_now_s() - t0) < 0.3);
#define ROW(NAME, FMA, BYTES)                                                                                   \
    printf("  %-34s %12.3g %13.1f%% %8.3f %10.2f\n", NAME, reps * (FMA) / el, 100 * reps * (FMA) / el / peak_core, \
           (BYTES) / (FMA), reps * (BYTES) / el / 1e9)
    printf("d %d, G %zu, %zu positions (K+V %.1f MiB fp32, %.1f MiB fp16), block of %zu steps, |S_t| %zu:\n", d, G, N,
           elems_ref * 4 / 1048576.0, elems_ref * 2 / 1048576.0, nb, budget);
    printf("  %-34s %12s %14s %8s %10s\n", "kernel", "FMA/s", "of 1-core peak", "B/FMA", "K/V GB/s");
    TIMED(kvs_attention_causal_block(q, nb, G, k, v, (size_t)d, p0, scale, prow, orow, NULL, NULL));
    ROW("full reference, blocked, fp32", fma_ref, elems_ref * 4);
    TIMED(kvs_attention_causal_block16(q, nb, G, k16, v16, KVS_DTYPE_F16, (size_t)d, p0, scale, prow, orow, NULL, NULL));
    ROW("full reference, blocked, fp16", fma_ref, elems_ref * 2);
    TIMED(kvs_attention_group(q, G, k, v, (size_t)d, idx, budget, (size_t)d, scale, prow, ob, NULL));
    ROW("S_t, G heads at once, fp32", fma_sel, elems_sel * 4);
    TIMED(kvs_attention_group16(q, G, k16, v16, KVS_DTYPE_F16, (size_t)d, idx, budget, (size_t)d, scale, prow, ob, NULL));
    ROW("S_t, G heads at once, fp16", fma_sel, elems_sel * 2);
    TIMED(kvs_attention_group(q, 1, k, v, (size_t)d, idx, budget, (size_t)d, scale, prow, ob, NULL));
    ROW("S_t, one head, fp32", fma_sel / (double)G, elems_sel * 4);
    TIMED(kvs_attention_group16(q, 1, k16, v16, KVS_DTYPE_F16, (size_t)d, idx, budget, (size_t)d, scale, prow, ob, NULL));
    ROW("S_t, one head, fp16", fma_sel / (double)G, elems_sel * 2);
#undef ROW
#undef TIMED
    free(k);
    free(k16);
    free(q);
    free(pb);
    free(ob);
    free(idx);
}

/* ---- the sweep ---- */

static const char *const sweep_policies[] = {"full",  "window", "streaming", "h2o",   "tova",
                                             "topk",  "snapkv", "knorm",     "quest", "keydiff"};
#define N_SWEEP_POLICIES 10
#define N_SWEEP_BUDGETS 8
static const int64_t sweep_budgets[N_SWEEP_BUDGETS] = {32, 64, 96, 128, 192, 256, 384, 512};

/* The side-by-side with bench/torch_replay.py: full/window/streaming/topk at the sweep's budgets, timed alone;
 * writes the trace arrays, the shape, and kvsim's per-layer output errors and wall time into `dir`. */
static void torch_side(const char *dir, const kvs_gen_trace *g, const kvs_replay_source *src, float scale,
                       int threads) {
    static const char *const pol[] = {"full", "window", "streaming", "topk"};
    enum { NP = 4 };
    kvs_replay_config cfgs[NP * N_SWEEP_BUDGETS];
    for (int p = 0; p < NP; p++)
        for (int b = 0; b < N_SWEEP_BUDGETS; b++) {
            kvs_replay_config *c = &cfgs[p * N_SWEEP_BUDGETS + b];
            *c = (kvs_replay_config){.budget = sweep_budgets[b], .budget_fraction = -1};
            CHECK(kvs_policy_parse(pol[p], &c->policy));
        }
    kvs_replay_opts ro = {.configs = cfgs, .n_configs = NP * N_SWEEP_BUDGETS, .threads = threads,
                          .measure = KVS_MEASURE_DECODE};
    kvs_replay_result *r = NULL;
    double t0 = kvs_now_s();
    CHECK(kvs_replay_execute(src, &ro, &r));
    double el = kvs_now_s() - t0;
    printf("side-by-side set (full/window/streaming/topk x %d budgets): kvsim %.3f s wall on %d threads; "
           "bench/torch_replay.py compares\n", N_SWEEP_BUDGETS, el, threads);
    char path[1024];
    const kvs_gen_trace_opts *o = &g->opt;
    int64_t qs[4] = {o->n_layers, o->n_positions, o->n_heads, o->head_dim};
    int64_t ks[4] = {o->n_layers, o->n_positions, o->n_kv_heads, o->head_dim};
    snprintf(path, sizeof path, "%s/q.npy", dir);
    CHECK(kvs_npy_write(path, KVS_NPY_F32, qs, 4, g->q));
    snprintf(path, sizeof path, "%s/k.npy", dir);
    CHECK(kvs_npy_write(path, KVS_NPY_F32, ks, 4, g->k));
    snprintf(path, sizeof path, "%s/v.npy", dir);
    CHECK(kvs_npy_write(path, KVS_NPY_F32, ks, 4, g->v));
    snprintf(path, sizeof path, "%s/kvsim.csv", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_speed: cannot write %s\n", path);
        exit(1);
    }
    /* first line: the shape and kvsim's wall time, then one row per (policy, budget, layer) */
    fprintf(f, "# prompt_len=%d scale=%.9g threads=%d kvsim_wall_s=%.6f\n", o->prompt_len, (double)scale, threads, el);
    fprintf(f, "policy,budget,layer,out_err_mean,n\n");
    for (int c = 0; c < NP * N_SWEEP_BUDGETS; c++)
        for (int l = 0; l < r->runs[c].n_layers; l++)
            fprintf(f, "%s,%lld,%d,%.9g,%lld\n", pol[c / N_SWEEP_BUDGETS], (long long)cfgs[c].budget, l,
                    r->runs[c].layer_aggs[l].out_err.mean, (long long)r->runs[c].layer_aggs[l].out_err.n);
    fclose(f);
    kvs_replay_result_free(r);
}

/* Rounds a generated trace's K/V to fp16 in place, as a trace stores them: a replay source made from the fixture
 * reads these same arrays, so with its kv_dtype set to fp16 it is what a captured fp16 trace gives the replay. */
static void round_kv_to_fp16(const kvs_gen_trace_opts *o, kvs_gen_trace *g) {
    size_t nkv = (size_t)o->n_layers * (size_t)o->n_positions * (size_t)o->n_kv_heads * (size_t)o->head_dim;
    uint16_t *h = malloc(nkv * sizeof *h);
    if (!h) exit(1);
    kvs_encode(KVS_DTYPE_F16, g->k, nkv, h);
    kvs_decode(KVS_DTYPE_F16, h, nkv, g->k);
    kvs_encode(KVS_DTYPE_F16, g->v, nkv, h);
    kvs_decode(KVS_DTYPE_F16, h, nkv, g->v);
    free(h);
}

/* The index of the median of v[0..n) (the upper one for an even n; equal values ordered by index). */
static int median_run(const double *v, int n) {
    for (int k = 0; k < n; k++) {
        int below = 0;
        for (int j = 0; j < n; j++) below += v[j] < v[k] || (v[j] == v[k] && j < k);
        if (below == n / 2) return k;
    }
    return 0;
}

/* One sweep run and its report: the configurations cfgs[0..nc) (policy pol_of[c] of sweep_policies) on src. */
static void sweep_run(int threads, const kvs_gen_trace_opts *o, int64_t scale, const kvs_replay_source *src,
                      const kvs_replay_config *cfgs, const int *pol_of, int nc, int kv16) {
    print_load(kv16 ? "sweep, K/V in fp16 (a captured trace's default)" : "sweep, K/V in fp32");
    printf("GENERATED trace (not a model): %d layers, %d query heads, %d KV heads, d %d, %d positions (prompt %d, %d "
           "decode steps measured); %d policies x %d budgets (%lld..%lld), %d threads\n",
           o->n_layers, o->n_heads, o->n_kv_heads, o->head_dim, o->n_positions, o->prompt_len,
           o->n_positions - o->prompt_len,
           nc / N_SWEEP_BUDGETS, N_SWEEP_BUDGETS, (long long)(sweep_budgets[0] * scale),
           (long long)(sweep_budgets[N_SWEEP_BUDGETS - 1] * scale), threads);
    kvs_replay_opts ro = {.configs = cfgs, .n_configs = nc, .threads = threads, .measure = KVS_MEASURE_DECODE};
    /* KVSIM_BENCH_SWEEP_REPS=n (1..9, default 3) runs of the same sweep, every run's times printed; the figures
     * below are the medians' (wall and CPU s each), the per-policy table the median-CPU run's: on a shared VM one
     * run's CPU time moves by 10% and more with the other guests' load (sim/BENCH.md "Comparing two builds") */
    const char *reps_env = getenv("KVSIM_BENCH_SWEEP_REPS");
    int reps = reps_env && reps_env[0] ? atoi(reps_env) : 3;
    if (reps < 1 || reps > 9) {
        fprintf(stderr, "bench_speed: KVSIM_BENCH_SWEEP_REPS must be 1..9\n");
        exit(2);
    }
    kvs_replay_result *runs[9] = {NULL};
    double els[9], cpus[9];
    for (int k = 0; k < reps; k++) {
        double t0 = kvs_now_s(), c0 = cpu_s(0);
        CHECK(kvs_replay_execute(src, &ro, &runs[k]));
        els[k] = kvs_now_s() - t0;
        cpus[k] = cpu_s(0) - c0;
    }
    int med = median_run(cpus, reps);
    double el = els[median_run(els, reps)], cpu = cpus[med];
    kvs_replay_result *r = runs[med];
    for (int k = 0; k < reps; k++)
        if (k != med) kvs_replay_result_free(runs[k]);
    printf("%d runs, in run order: CPU s", reps);
    for (int k = 0; k < reps; k++) printf(" %.2f", cpus[k]);
    printf("; wall s");
    for (int k = 0; k < reps; k++) printf(" %.2f", els[k]);
    printf("%s\n", reps > 1 ? " (the figures below: the median wall and the median CPU time)" : "");
    /* FMAs: the full reference once per (layer, query head, decode step) over 0..p, shared by every
     * configuration; each configuration's attention over its S_t. A pair = 2 d FMAs (dot + axpy). */
    double d = o->head_dim, ref_pairs = 0, pol_pairs = 0, pol_pairs_p[N_SWEEP_POLICIES] = {0}, copied_pairs = 0;
    double wall_p[N_SWEEP_POLICIES] = {0};
    for (int64_t p = o->prompt_len; p < o->n_positions; p++) ref_pairs += (double)o->n_layers * o->n_heads * (double)(p + 1);
    for (int c = 0; c < nc; c++) {
        const kvs_results_stat *a = &r->runs[c].run_agg.attended_tokens;
        if (r->runs[c].status != KVS_OK) printf("run %s:%lld failed: %s\n", sweep_policies[pol_of[c]],
                                                (long long)cfgs[c].budget, r->runs[c].error);
        pol_pairs += a->mean * (double)a->n;
        pol_pairs_p[pol_of[c]] += a->mean * (double)a->n;
        /* `full` attends the whole prefix at every step: the replay copies the reference's rows (sim/replay.c
         * list_is_prefix), so its pairs are nominal work, not computed again (no other policy's list is the
         * whole prefix here: every budget is below the prompt) */
        if (!strcmp(sweep_policies[pol_of[c]], "full")) copied_pairs += a->mean * (double)a->n;
        wall_p[pol_of[c]] += r->runs[c].wall_seconds;
    }
    double fmas = 2 * d * (ref_pairs + pol_pairs), fmas_direct = 2 * d * (ref_pairs + pol_pairs - copied_pairs);
    /* With the reference's scores reused (kvs_replay_opts.ref_scores, on by default: every decode step here is
     * measured, so its reference is computed, and no sweep policy holds merged slots), a configuration computes
     * only its output over S_t: d FMAs a pair; the scores' d were computed once, by the reference. */
    double fmas_run = 2 * d * ref_pairs + d * (pol_pairs - copied_pairs);
    printf("whole sweep: %.2f s wall, %.3g reference pairs + %.3g policy pairs = %.3g FMA -> %.3g FMA/s = %.1f%% of "
           "the all-core peak (policy bookkeeping included)\n",
           el, ref_pairs, pol_pairs, fmas, fmas / el, 100 * fmas / el / peak_all);
    printf("  in CPU time (what other developers' load does not change): %.2f CPU s, %.3g FMA per CPU s = %.1f%% of the "
           "per-core peak\n", cpu, fmas / cpu, 100 * fmas / cpu / peak_core_cpu);
    printf("  a direct replay's FMAs (every configuration its own scores and output; the %.3g pairs of `full`, copies "
           "of the reference, left out): %.3g FMA in this time -> %.1f%% of the all-core peak in wall time, %.1f%% of "
           "the per-core peak in CPU time\n",
           copied_pairs, fmas_direct, 100 * fmas_direct / el / peak_all, 100 * fmas_direct / cpu / peak_core_cpu);
    printf("  FMAs computed (S_t's scores taken from the reference's, so d FMAs a policy pair): %.3g FMA -> %.1f%% of "
           "the all-core peak in wall time, %.1f%% of the per-core peak in CPU time\n",
           fmas_run, 100 * fmas_run / el / peak_all, 100 * fmas_run / cpu / peak_core_cpu);
    /* A users' sweep: 10 policies x 8 budgets over 32-layer, 8K-position traces of Llama-3.1-8B's shape (32 query
     * heads), about 2e11 (query head, attended token) pairs */
    double pairs_per_head = (ref_pairs + pol_pairs) / ((double)o->n_layers * o->n_heads);
    printf("  (query head, attended token) pairs: %.3g per layer and query head, %.3g at Llama-3.1-8B's 32 layers x 32 "
           "query heads (the issue's users' sweep: about 2e11)\n",
           pairs_per_head, pairs_per_head * 32 * 32);
    printf("  %-10s %10s %12s %14s  (thread seconds per policy over its %d budgets, reference time shared out)\n",
           "policy", "thread_s", "policy pairs", "pairs/thread-s", N_SWEEP_BUDGETS);
    for (int p = 0; p < N_SWEEP_POLICIES; p++)
        if (wall_p[p] > 0)
            printf("  %-10s %10.3f %12.4g %14.4g\n", sweep_policies[p], wall_p[p], pol_pairs_p[p],
                   pol_pairs_p[p] / wall_p[p]);
    kvs_replay_result_free(r);
}

/* KVSIM_BENCH_SWEEP_SCALE=s (1..8, default 1): s times the positions (the same 512 decode steps after a longer
 * prompt) and s times every budget; s = 4 is the length users sweep (8192 positions, budgets 128..2048) */
static int64_t sweep_scale_env(void) {
    const char *scale_env = getenv("KVSIM_BENCH_SWEEP_SCALE");
    int64_t scale = scale_env && scale_env[0] ? atoll(scale_env) : 1;
    if (scale < 1 || scale > 8) {
        fprintf(stderr, "bench_speed: KVSIM_BENCH_SWEEP_SCALE must be 1..8\n");
        exit(2);
    }
    return scale;
}

/* KVSIM_BENCH_SWEEP_DECODE=n (default 512): the decode steps measured at the end of the trace, the rest its
 * prompt; a full run's two 8192-position sweeps set their own (main below) */
static int sweep_decode_env(int64_t scale) {
    const char *e = getenv("KVSIM_BENCH_SWEEP_DECODE");
    int n = e && e[0] ? atoi(e) : 512;
    if (n < 1 || n >= 2048 * scale) {
        fprintf(stderr, "bench_speed: KVSIM_BENCH_SWEEP_DECODE must be 1..%lld\n", (long long)(2048 * scale - 1));
        exit(2);
    }
    return n;
}

/* `only` (NULL = all): the sweep restricted to that policy's 8 budgets, for a per-policy CPU time. want32: on the
 * generated fp32 K/V; want16: on the K/V rounded to fp16 and the source declared fp16, as a captured trace is by
 * default (`kvsim capture --dtype`), so the replay keeps its 16-bit history beside the fp32 one and attends
 * through the 16-bit kernels. Both: one generated trace, the fp32 sweep first, then rounded in place. with_torch:
 * the side-by-side with PyTorch too (when KVSIM_BENCH_NPY_DIR is set and the sweep is not one policy's), on the
 * fp32 data. decode: the decode steps measured (the last ones; the rest is the prompt). */
static void sweep(int threads, const char *only, int want32, int want16, int64_t scale, int decode, int with_torch) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 2;
    o.n_heads = 8;
    o.n_kv_heads = 2;
    o.head_dim = 128;
    o.n_positions = (int)(2048 * scale);
    o.prompt_len = o.n_positions - decode;
    kvs_test_replay_fixture fx; /* the generated data as a replay source: 2-byte K/V, blocks of 64 */
    CHECK(kvs_test_replay_fixture_make(&o, 2, 64, &fx));
    kvs_gen_trace *g = fx.g;
    kvs_replay_source src;
    CHECK(kvs_replay_source_from_memory(&fx.mem, &src));
    int nc = 0, pol_of[N_SWEEP_POLICIES * N_SWEEP_BUDGETS];
    kvs_replay_config cfgs[N_SWEEP_POLICIES * N_SWEEP_BUDGETS];
    for (int p = 0; p < N_SWEEP_POLICIES; p++)
        for (int b = 0; b < N_SWEEP_BUDGETS && (!only || !strcmp(only, sweep_policies[p])); b++) {
            kvs_replay_config *c = &cfgs[nc];
            pol_of[nc++] = p;
            *c = (kvs_replay_config){.budget = sweep_budgets[b] * scale, .budget_fraction = -1};
            CHECK(kvs_policy_parse(sweep_policies[p], &c->policy));
        }
    if (nc == 0) {
        fprintf(stderr, "bench_speed: no sweep policy named %s\n", only);
        exit(2);
    }
    for (int kv16 = !want32; kv16 <= want16; kv16++) {
        if (kv16) {
            round_kv_to_fp16(&o, g);
            src.kv_dtype = KVS_DTYPE_F16;
        }
        sweep_run(threads, &o, scale, &src, cfgs, pol_of, nc, kv16);
        const char *npy = getenv("KVSIM_BENCH_NPY_DIR");
        if (with_torch && npy && npy[0] && !only && !kv16) torch_side(npy, g, &src, fx.scale, threads);
    }
    kvs_test_replay_fixture_free(&fx);
}

/* The GENERATED data of the per-policy figures (codec_part, policies_part): 2 layers, 8 query heads, 2 KV heads, d 128,
 * 2048 x KVSIM_BENCH_SWEEP_SCALE positions (default 4: 8192) of which KVSIM_BENCH_SWEEP_DECODE are decode steps,
 * as the sweep's fixture (2-byte K/V, blocks of 64), and the rounds KVSIM_BENCH_SWEEP_REPS (1..9, default
 * default_reps). Made in place: src reads fx's memory. */
typedef struct {
    int64_t scale;
    int decode, reps;
    kvs_gen_trace_opts o;
    kvs_test_replay_fixture fx;
    kvs_replay_source src;
} policy_shape;

static void policy_shape_make(int default_reps, policy_shape *ps) {
    const char *scale_env = getenv("KVSIM_BENCH_SWEEP_SCALE");
    ps->scale = scale_env && scale_env[0] ? sweep_scale_env() : 4;
    ps->decode = sweep_decode_env(ps->scale);
    const char *reps_env = getenv("KVSIM_BENCH_SWEEP_REPS");
    ps->reps = reps_env && reps_env[0] ? atoi(reps_env) : default_reps;
    if (ps->reps < 1 || ps->reps > 9) {
        fprintf(stderr, "bench_speed: KVSIM_BENCH_SWEEP_REPS must be 1..9\n");
        exit(2);
    }
    ps->o = kvs_gen_trace_defaults();
    ps->o.n_layers = 2;
    ps->o.n_heads = 8;
    ps->o.n_kv_heads = 2;
    ps->o.head_dim = 128;
    ps->o.n_positions = (int)(2048 * ps->scale);
    ps->o.prompt_len = ps->o.n_positions - ps->decode;
    CHECK(kvs_test_replay_fixture_make(&ps->o, 2, 64, &ps->fx));
    CHECK(kvs_replay_source_from_memory(&ps->fx.mem, &ps->src));
}

/* ---- a KV codec's cost (sim/BENCH.md "A codec's cost") ----
 * One policy's 8 budgets at the 8192-position shape of the per-policy figures (KVSIM_BENCH_SWEEP_SCALE, default 4
 * here: prompt 7680, KVSIM_BENCH_SWEEP_DECODE = 512 decode steps measured, budgets 128..2048; fp32 K/V), as one
 * kvs_replay_execute without a codec, with int:bits=4 and with kivi (KIVI-2's defaults), every configuration under
 * the same codec (one codec state per layer, shared). The three alternate within each of KVSIM_BENCH_SWEEP_REPS
 * rounds, so the machine's drift falls on all of them; the medians of each one's CPU and wall times are compared
 * with the run without a codec. */
static void codec_part(int threads, const char *policy) {
    static policy_shape ps;
    policy_shape_make(3, &ps);
    const int64_t scale = ps.scale;
    const int decode = ps.decode, reps = ps.reps;
    const kvs_gen_trace_opts o = ps.o;
    kvs_replay_source src = ps.src;
    kvs_replay_config cfgs[N_SWEEP_BUDGETS];
    for (int b = 0; b < N_SWEEP_BUDGETS; b++) {
        cfgs[b] = (kvs_replay_config){.budget = sweep_budgets[b] * scale, .budget_fraction = -1};
        CHECK(kvs_policy_parse(policy, &cfgs[b].policy));
    }
    enum { NM = 3 };
    static const char *const specs[NM] = {NULL, "int:bits=4", "kivi"};
    kvs_codec *codec[NM] = {NULL};
    const kvs_codec *per_cfg[NM][N_SWEEP_BUDGETS];
    for (int m = 0; m < NM; m++) {
        if (specs[m]) CHECK(kvs_codec_parse(specs[m], &codec[m]));
        for (int b = 0; b < N_SWEEP_BUDGETS; b++) per_cfg[m][b] = codec[m];
    }
    print_load("a codec's cost");
    printf("GENERATED trace (not a model): %d layers, %d query heads, %d KV heads, d %d, %d positions (prompt %d, %d "
           "decode steps measured); %s x %d budgets (%lld..%lld), fp32 K/V, %d threads; each codec applies to every "
           "budget; %d rounds, the three alternating\n",
           o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, o.n_positions, o.prompt_len, decode, policy,
           N_SWEEP_BUDGETS, (long long)(sweep_budgets[0] * scale), (long long)(sweep_budgets[N_SWEEP_BUDGETS - 1] * scale),
           threads, reps);
    double els[NM][9], cpus[NM][9], err[NM] = {0}, mem[NM] = {0};
    for (int k = 0; k < reps; k++)
        for (int m = 0; m < NM; m++) {
            kvs_replay_opts ro = {.configs = cfgs, .n_configs = N_SWEEP_BUDGETS, .threads = threads,
                                  .measure = KVS_MEASURE_DECODE, .codecs = specs[m] ? per_cfg[m] : NULL};
            kvs_replay_result *r = NULL;
            double t0 = kvs_now_s(), c0 = cpu_s(0);
            CHECK(kvs_replay_execute(&src, &ro, &r));
            els[m][k] = kvs_now_s() - t0;
            cpus[m][k] = cpu_s(0) - c0;
            for (int b = 0; b < N_SWEEP_BUDGETS; b++) {
                if (r->runs[b].status != KVS_OK)
                    printf("run %s:%lld with %s failed: %s\n", policy, (long long)cfgs[b].budget,
                           specs[m] ? specs[m] : "no codec", r->runs[b].error);
                if (k == 0) { /* what each codec does to the numbers: a reading, the same in every round */
                    err[m] += r->runs[b].run_agg.out_err.mean / N_SWEEP_BUDGETS;
                    mem[m] += r->runs[b].run_agg.storage_bytes.mean / N_SWEEP_BUDGETS;
                }
            }
            kvs_replay_result_free(r);
        }
    double cpu0 = cpus[0][median_run(cpus[0], reps)], el0 = els[0][median_run(els[0], reps)];
    printf("  %-48s %8s %8s %9s %9s %11s %12s  (CPU s of every round)\n", "codec", "CPU s", "wall s", "CPU x", "wall x",
           "mean err", "mean res B");
    for (int m = 0; m < NM; m++) {
        double cpu = cpus[m][median_run(cpus[m], reps)], el = els[m][median_run(els[m], reps)];
        printf("  %-48s %8.2f %8.2f %8.2fx %8.2fx %11.4g %12.4g ", codec[m] ? kvs_codec_spec(codec[m]) : "(none)",
               cpu, el, cpu / cpu0, el / el0, err[m], mem[m]);
        for (int k = 0; k < reps; k++) printf(" %.2f", cpus[m][k]);
        printf("\n");
    }
    printf("  (x: the median against the run without a codec; mean err and res B: out_err and resident bytes per KV "
           "head, each run's mean averaged over the %d budgets)\n", N_SWEEP_BUDGETS);
    for (int m = 0; m < NM; m++) kvs_codec_free(codec[m]);
    kvs_test_replay_fixture_free(&ps.fx);
}

/* ---- the replay with its K/V history in 16 bits against fp32 ----
 * A GENERATED trace of Llama shape (d 128, G 4) whose K/V are rounded to fp16, as a trace's are, replayed with
 * the fp32 history alone (kv16 = -1) and with the 16-bit history beside it (kv16 = 1), alternately, twice each;
 * the numbers of the two are compared (they must be equal bit for bit). Context: 8192 positions, so a task's
 * fp32 K/V (2 KV heads: 16 MiB) and the two threads' (32 MiB) do not stay in the caches. */
static void replay16(int threads) {
    kvs_gen_trace_opts o = kvs_gen_trace_defaults();
    o.n_layers = 2;
    o.n_heads = 8;
    o.n_kv_heads = 2;
    o.head_dim = 128;
    o.n_positions = 8192;
    o.prompt_len = 7680;
    kvs_test_replay_fixture fx; /* the generated data as a replay source: 2-byte K/V, blocks of 64 */
    CHECK(kvs_test_replay_fixture_make(&o, 2, 64, &fx));
    round_kv_to_fp16(&o, fx.g);
    kvs_replay_source src;
    CHECK(kvs_replay_source_from_memory(&fx.mem, &src));
    src.kv_dtype = KVS_DTYPE_F16;
    static const char *const pol[] = {"full", "window", "quest"};
    static const int64_t bud[] = {1024, 4096};
    enum { NP = 3, NB = 2, ROUNDS = 2 };
    kvs_replay_config cfgs[NP * NB];
    for (int p = 0; p < NP; p++)
        for (int b = 0; b < NB; b++) {
            cfgs[p * NB + b] = (kvs_replay_config){.budget = bud[b], .budget_fraction = -1};
            CHECK(kvs_policy_parse(pol[p], &cfgs[p * NB + b].policy));
        }
    print_load("replay, K/V history fp32 vs 16-bit");
    double hist32 = 2.0 * (double)o.n_kv_heads * o.n_positions * o.head_dim * 4 / 1048576.0;
    printf("GENERATED trace (not a model), K/V rounded to fp16: %d layers, %d query heads, %d KV heads, d %d, %d "
           "positions (%d decode steps measured); full, window, quest at budgets 1024 and 4096; "
           "%d threads. K/V history per task: %.0f MiB fp32, + %.0f MiB with the 16-bit copy\n",
           o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, o.n_positions, o.n_positions - o.prompt_len, threads,
           hist32, hist32 / 2);
    kvs_replay_result *first[2] = {NULL, NULL};
    double best[2] = {1e30, 1e30};
    for (int round = 0; round < ROUNDS; round++)
        for (int m = 0; m < 2; m++) {
            kvs_replay_opts ro = {.configs = cfgs, .n_configs = NP * NB, .threads = threads,
                                  .measure = KVS_MEASURE_DECODE, .kv16 = m ? 1 : -1};
            kvs_replay_result *r = NULL;
            double t0 = kvs_now_s();
            CHECK(kvs_replay_execute(&src, &ro, &r));
            double el = kvs_now_s() - t0;
            printf("  round %d, %-14s %8.2f s wall\n", round + 1, m ? "16-bit history" : "fp32 history", el);
            if (el < best[m]) best[m] = el;
            if (!first[m]) first[m] = r;
            else kvs_replay_result_free(r);
        }
    int equal = 1;
    for (int c = 0; c < NP * NB; c++) {
        const kvs_replay_run_result *a = &first[0]->runs[c], *b = &first[1]->runs[c];
        equal &= a->status == KVS_OK && b->status == KVS_OK &&
                 !memcmp(&a->run_agg.out_err, &b->run_agg.out_err, sizeof a->run_agg.out_err) &&
                 !memcmp(&a->run_agg.attn_recall, &b->run_agg.attn_recall, sizeof a->run_agg.attn_recall) &&
                 !memcmp(&a->run_agg.topk_overlap, &b->run_agg.topk_overlap, sizeof a->run_agg.topk_overlap);
    }
    printf("best of %d: fp32 history %.2f s, 16-bit history %.2f s (%.2fx); output error, recall and top-k overlap "
           "of every run %s\n", ROUNDS, best[0], best[1], best[0] / best[1], equal ? "equal bit for bit" : "DIFFER");
    kvs_replay_result_free(first[0]);
    kvs_replay_result_free(first[1]);
    kvs_test_replay_fixture_free(&fx);
}

/* The 16-bit K/V part (sim/BENCH.md "K/V in 16 bits"): the kernels, then the replay. @return 1 when the
 * environment asks for this part alone (KVSIM_BENCH_KV16_ONLY). */
static int kv16_part(int threads) {
    print_load("kernels over fp16 K/V against fp32 (1 core)");
    for (int d = 64; d <= 128; d *= 2) {
        kernels16(d, 2048);
        kernels16(d, 32768);
    }
    replay16(threads);
    return getenv("KVSIM_BENCH_KV16_ONLY") != NULL;
}

/* Optional arguments: "kernels", "sweep" (K/V in fp32) or "sweep16" (K/V in fp16) runs that part alone (after the
 * machine's ceilings), e.g. under perf; "sweep POLICY" the sweep of that one policy (its CPU time is the
 * per-policy figure of sim/BENCH.md). A full run runs both sweeps, then the fp32 sweep at 4x the positions in two
 * shapes (below). */
/* ---- policies against each other (sim/BENCH.md "Policies against H2O") ----
 * Each spec's 8 budgets at the 8192-position shape of codec_part (KVSIM_BENCH_SWEEP_SCALE, default 4: prompt 7680,
 * 512 decode steps measured, budgets 128..2048; fp32 K/V), one kvs_replay_execute per spec, no codec; the specs
 * alternate within each of KVSIM_BENCH_SWEEP_REPS rounds (default 1 here) so the machine's drift falls on all; the
 * median CPU and wall times of each against the first spec's (give h2o first). */
static void policies_part(int threads, char **specs, int n_specs) {
    if (n_specs > 32) {
        fprintf(stderr, "bench_speed: at most 32 specs\n");
        exit(2);
    }
    static policy_shape ps;
    policy_shape_make(1, &ps);
    const int64_t scale = ps.scale;
    const int decode = ps.decode, reps = ps.reps;
    const kvs_gen_trace_opts o = ps.o;
    kvs_replay_source src = ps.src;
    static kvs_replay_config cfgs[32][N_SWEEP_BUDGETS];
    for (int i = 0; i < n_specs; i++)
        for (int b = 0; b < N_SWEEP_BUDGETS; b++) {
            cfgs[i][b] = (kvs_replay_config){.budget = sweep_budgets[b] * scale, .budget_fraction = -1};
            CHECK(kvs_policy_parse(specs[i], &cfgs[i][b].policy));
        }
    print_load("policies against the first");
    printf("GENERATED trace (not a model): %d layers, %d query heads, %d KV heads, d %d, %d positions (prompt %d, %d "
           "decode steps measured); each spec x %d budgets (%lld..%lld), fp32 K/V, %d threads; %d rounds, the specs "
           "alternating\n",
           o.n_layers, o.n_heads, o.n_kv_heads, o.head_dim, o.n_positions, o.prompt_len, decode, N_SWEEP_BUDGETS,
           (long long)(sweep_budgets[0] * scale), (long long)(sweep_budgets[N_SWEEP_BUDGETS - 1] * scale), threads,
           reps);
    static double els[32][9], cpus[32][9];
    for (int k = 0; k < reps; k++)
        for (int i = 0; i < n_specs; i++) {
            kvs_replay_opts ro = {.configs = cfgs[i], .n_configs = N_SWEEP_BUDGETS, .threads = threads,
                                  .measure = KVS_MEASURE_DECODE};
            kvs_replay_result *r = NULL;
            double t0 = kvs_now_s(), c0 = cpu_s(0);
            CHECK(kvs_replay_execute(&src, &ro, &r));
            els[i][k] = kvs_now_s() - t0;
            cpus[i][k] = cpu_s(0) - c0;
            for (int b = 0; b < N_SWEEP_BUDGETS; b++)
                if (r->runs[b].status != KVS_OK)
                    printf("run %s:%lld failed: %s\n", specs[i], (long long)cfgs[i][b].budget, r->runs[b].error);
            kvs_replay_result_free(r);
            printf("  round %d: %-40s %8.2f CPU s %8.2f wall s\n", k + 1, specs[i], cpus[i][k], els[i][k]);
            fflush(stdout);
        }
    double cpu0 = cpus[0][median_run(cpus[0], reps)], el0 = els[0][median_run(els[0], reps)];
    printf("  %-40s %8s %8s %9s %9s\n", "policy", "CPU s", "wall s", "CPU x", "wall x");
    for (int i = 0; i < n_specs; i++) {
        double cpu = cpus[i][median_run(cpus[i], reps)], el = els[i][median_run(els[i], reps)];
        printf("  %-40s %8.2f %8.2f %8.2fx %8.2fx\n", specs[i], cpu, el, cpu / cpu0, el / el0);
    }
    printf("  (x: the median against %s's; the replay's reference, shared by every policy, is in each time)\n",
           specs[0]);
    kvs_test_replay_fixture_free(&ps.fx);
}

int main(int argc, char **argv) {
    int threads = kvs_n_cpus();
    const char *only = argc > 1 ? argv[1] : "";
    int is_sweep = !strcmp(only, "sweep") || !strcmp(only, "sweep16"), is_codec = !strcmp(only, "codec");
    if (!strcmp(only, "policies")) {
        if (argc < 3) {
            fprintf(stderr, "usage: bench_speed policies SPEC [SPEC ...] (the first is the yardstick, e.g. h2o)\n");
            return 2;
        }
        machine(threads);
        policies_part(threads, argv + 2, argc - 2);
        return 0;
    }
    if ((only[0] && strcmp(only, "kernels") && !is_sweep && !is_codec) || (argc > 2 && !is_sweep && !is_codec) ||
        argc > 3) {
        fprintf(stderr, "usage: bench_speed [kernels | sweep [POLICY] | sweep16 [POLICY] | codec [POLICY] | "
                        "policies SPEC [SPEC ...]]\n");
        return 2;
    }
    machine(threads);
    if (is_codec) {
        codec_part(threads, argc > 2 ? argv[2] : "h2o");
        return 0;
    }
    if (!is_sweep) {
        print_load("kernels (1 core)");
        kernels(64);
        kernels(128);
        if (!only[0] && kv16_part(threads)) return 0; /* the 16-bit part in a full run only */
    }
    if (!strcmp(only, "kernels")) return 0;
    const char *policy = argc > 2 ? argv[2] : NULL;
    int64_t scale = sweep_scale_env();
    sweep(threads, policy, strcmp(only, "sweep16") != 0, strcmp(only, "sweep") != 0, scale, sweep_decode_env(scale),
          1);
    /* A full run also sweeps at the length users sweep (8192 positions, budgets 128..2048; fp32 K/V) twice:
     * - after a 7680-position prompt, the same 512 decode steps: the policies' prompt scoring (H2O's column sums
     *   over the whole prompt, FMAs that no reading counts) and the value rows' traffic weigh more than at 2048
     *   (sim/BENCH.md "Where the time goes now");
     * - 1536 decode steps after a 6656-position prompt: the shape whose pairs, scaled to Llama-3.1-8B's 32 layers x
     *   32 query heads, are a users' sweep's, about 2e11 (the pairs line of the report; sim/BENCH.md "Yardsticks
     *   and floors"). */
    if (!only[0] && scale == 1) {
        sweep(threads, NULL, 1, 0, 4, 512, 0);
        sweep(threads, NULL, 1, 0, 4, 1536, 0);
    }
    if (!only[0]) codec_part(threads, "h2o"); /* a KV codec's cost at the 8192-position shape */
    return 0;
}
