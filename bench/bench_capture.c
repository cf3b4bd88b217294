/* bench_capture.c — CPU decode speed of the reference forward pass, without trace capture, with the full record
 * and with the lean one (--record qkv, trace/FORMAT.md "Lean record"), on the
 * real stories260K and on a ~110M-parameter Llama-shaped llama2.c checkpoint with random weights (written
 * to /tmp at run time; speed only, its text is noise), beside the machine's floor: measured memcpy
 * bandwidth and FMA throughput, floor tokens/s = bandwidth / weight bytes read per token (decode of one
 * sequence is memory-bound: every weight is read once per token).
 * Usage: bench_capture [threads]   (KVSIM_ROOT locates ../shared/models). Timings are printed, never asserted.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/kvs.h"
#include "gpu_capture/capture.h"
#include "gpu_capture/model.h"

#define CHECK(x)                                                                                     \
    do {                                                                                             \
        kvs_status s_ = (x);                                                                         \
        if (s_ != KVS_OK) {                                                                          \
            fprintf(stderr, "bench_capture: %s failed: %s (%s)\n", #x, kvs_strerror(s_), kvs_last_error()); \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static double memcpy_gbps(void) {
    size_t n = (size_t)256 << 20;
    char *a = malloc(n), *b = malloc(n);
    if (!a || !b) exit(1);
    memset(a, 1, n);
    memset(b, 2, n);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = kvs_now_s();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, n);
        double dt = kvs_now_s() - t0;
        double gbps = 2.0 * (double)n / dt / 1e9; /* read + write */
        if (gbps > best) best = gbps;
    }
    volatile char sink = a[n / 2] + b[n / 3];
    (void)sink;
    free(a);
    free(b);
    return best;
}

static double fma_gflops(void) {
    float acc[16];
    for (int i = 0; i < 16; i++) acc[i] = (float)i * 1e-3f;
    const float m = 0.999999f, c = 1e-7f;
    long iters = 50000000;
    double t0 = kvs_now_s();
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 16; i++) acc[i] = acc[i] * m + c;
    double dt = kvs_now_s() - t0;
    float s = 0;
    for (int i = 0; i < 16; i++) s += acc[i];
    volatile float sink = s;
    (void)sink;
    return 2.0 * 16 * (double)iters / dt / 1e9;
}

/* Writes a llama2.c checkpoint with uniform random weights in [-a, a] (xorshift, fixed seed). */
static void write_random_llama2c(const char *path, int dim, int hidden, int layers, int heads, int vocab, int seq) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    int32_t h[7] = {dim, hidden, layers, heads, heads, vocab, seq};
    fwrite(h, 4, 7, f);
    uint64_t n = (uint64_t)vocab * dim + (uint64_t)layers * (2ull * dim + 4ull * dim * dim + 3ull * hidden * dim) + dim +
                 (uint64_t)seq * (dim / heads);
    float buf[4096];
    uint64_t x = 88172645463325252ull;
    for (uint64_t done = 0; done < n;) {
        size_t k = n - done < 4096 ? (size_t)(n - done) : 4096;
        for (size_t i = 0; i < k; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            buf[i] = ((float)(x >> 40) / 16777216.0f - 0.5f) * 0.05f;
        }
        fwrite(buf, 4, k, f);
        done += k;
    }
    fclose(f);
}

static void bench_model(const char *label, const char *path, int steps, int threads, double bw_gbps) {
    kvs_model *m;
    CHECK(kvs_model_load(path, &m));
    const kvs_model_info *info = kvs_model_info_get(m);
    double floor_tps = bw_gbps * 1e9 / (double)info->weight_bytes;
    kvs_model_free(m);
    char out[256];
    snprintf(out, sizeof out, "/tmp/bench_capture_%d.kvt", (int)getpid());
    double tps[3];
    uint64_t bytes[3] = {0, 0, 0};
    for (int cap = 0; cap < 3; cap++) { /* 0: no trace, 1: full record, 2: lean record */
        kvs_capture_opts o;
        memset(&o, 0, sizeof o);
        o.model_path = path;
        o.prompt_ids = NULL;
        o.steps = steps;
        o.ignore_eos = 1;
        o.top_p = 1;
        o.threads = threads;
        o.dtype = KVS_DTYPE_F16;
        o.out_path = cap ? out : NULL;
        o.record_qkv = cap == 2;
        int32_t bos = 1;
        o.prompt_ids = &bos;
        o.n_prompt_ids = 0; /* BOS alone */
        kvs_capture_result r;
        CHECK(kvs_capture_run(&o, &r));
        tps[cap] = (double)r.n_positions / r.seconds;
        bytes[cap] = r.trace_bytes;
        kvs_capture_result_free(&r);
    }
    unlink(out);
    printf("%-44s %6.1fM params  %8.1f tok/s plain  %8.1f tok/s capture (fp16 trace %.2f MB, overhead %+.1f%%)  "
           "%8.1f tok/s lean capture (%.2f MB, overhead %+.1f%%)  floor %.1f tok/s (%.0f MB weights/token)\n",
           label, (double)info->n_params / 1e6, tps[0], tps[1], (double)bytes[1] / 1e6, 100.0 * (tps[0] / tps[1] - 1.0),
           tps[2], (double)bytes[2] / 1e6, 100.0 * (tps[0] / tps[2] - 1.0), floor_tps, (double)info->weight_bytes / 1e6);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 0;
    const char *root = getenv("KVSIM_ROOT");
    char p[4096];
    printf("bench_capture: CPU reference decode, %d thread(s), %d CPUs\n", threads > 0 ? threads : kvs_n_cpus(), kvs_n_cpus());
    double bw = memcpy_gbps(), fl = fma_gflops();
    printf("machine floor: memcpy %.2f GB/s (read+write), scalar-loop FMA %.2f GFLOP/s (1 thread)\n", bw, fl);
    snprintf(p, sizeof p, "%s/../shared/models/stories260K.bin", root ? root : ".");
    if (access(p, R_OK) == 0) bench_model("stories260K (real)", p, 400, threads, bw);
    else printf("stories260K: skipped (%s absent)\n", p);
    snprintf(p, sizeof p, "/tmp/bench_capture_random_%d.bin", (int)getpid());
    write_random_llama2c(p, 768, 2048, 12, 12, 32000, 256);
    bench_model("dim768 x12 layers (random weights, speed only)", p, 24, threads, bw);
    unlink(p);
    return 0;
}
