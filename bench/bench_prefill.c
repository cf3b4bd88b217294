/* bench_prefill.c — the CPU forward pass on a Llama-3.2-1B-shaped checkpoint with RANDOM bf16 weights
 * (bench/llama1b_checkpoint.h: written once into /tmp, reused; speed only): the blocked prefill of a 2048-token
 * prompt (kvs_model_forward_block, gpu_capture/matmul.h) against the machine's measured all-core fp32 FMA peak
 * over its matrix-product FLOPs, the token-by-token decode that follows against the 16-bit weight-bandwidth floor
 * (weight bytes read per token / measured all-core read bandwidth, both measured in this run), and the peak RSS
 * against the checkpoint's bytes plus the KV cache (16-bit matrices are packed into panels at load and their mapped
 * pages dropped), and the load time.
 * Prints Markdown rows for gpu_capture/BENCH.md "CPU"; nothing is asserted.
 * Usage: bench_prefill [prompt_tokens [decode_tokens [threads]]]   (defaults 2048, 32, all CPUs)
 * The peaks are probed after the model runs, so their buffers do not count in the peak RSS.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "common/kvs.h"
#include "common/kvs_peak.h"
#include "common/threadpool.h"
#include "gpu_capture/matmul.h"
#include "gpu_capture/model.h"
#include "gpu_capture/model_weights.h"

#define CHECK(x)                                                                                             \
    do {                                                                                                     \
        kvs_status s_ = (x);                                                                                 \
        if (s_ != KVS_OK) {                                                                                  \
            fprintf(stderr, "bench_prefill: %s failed: %s (%s)\n", #x, kvs_strerror(s_), kvs_last_error()); \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

#include "bench/llama1b_checkpoint.h"

static void cpu_name(char *buf, size_t cap) {
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            c += 2;
            c[strcspn(c, "\n")] = '\0';
            snprintf(buf, cap, "%s", c);
            break;
        }
    }
    fclose(f);
}

/* CPU seconds (user + system) this process has used: beside the wall time, how much of the cores it had on a
 * shared machine. */
static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
           1e-6 * (double)ru.ru_stime.tv_usec;
}

static void loadavg(char *buf, size_t cap) {
    snprintf(buf, cap, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(buf, cap, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

int main(int argc, char **argv) {
    int n_prompt = argc > 1 ? atoi(argv[1]) : 2048, n_dec = argc > 2 ? atoi(argv[2]) : 32;
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    if (n_prompt < 1 || n_prompt + n_dec > B_CTX || n_dec < 1) {
        fprintf(stderr, "usage: bench_prefill [prompt_tokens [decode_tokens [threads]]] (prompt + decode <= %d)\n", B_CTX);
        return 2;
    }
    char cpu[256], load0[64], load1[64];
    cpu_name(cpu, sizeof cpu);
    loadavg(load0, sizeof load0);
    double t0 = kvs_now_s();
    write_checkpoint();
    double t_gen = kvs_now_s() - t0;
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", BENCH_DIR);
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        return 1;
    }
    double ckpt_bytes = (double)st.st_size;

    kvs_threadpool *pool;
    CHECK(kvs_threadpool_create(threads, &pool));
    int nt = kvs_threadpool_size(pool);
    kvs_model *m;
    double t_load = kvs_now_s();
    CHECK(kvs_model_load(BENCH_DIR, &m));
    const kvs_model_info *info = kvs_model_info_get(m);
    const kvs_model_config *c = &info->config;
    int max_pos = n_prompt + n_dec;
    kvs_model_state *s;
    CHECK(kvs_model_state_create(m, max_pos, pool, &s)); /* the first state packs the 16-bit panels */
    t_load = kvs_now_s() - t_load;
    double d = c->dim, hid = c->hidden_dim, L = c->n_layers, qd = (double)c->n_heads * c->head_dim;
    double kvd = (double)c->n_kv_heads * c->head_dim, V = c->vocab_size;
    double kv_bytes = 2.0 * L * max_pos * kvd * sizeof(float);

    int32_t *tok = malloc((size_t)max_pos * sizeof *tok);
    if (!tok) return 1;
    for (int i = 0; i < max_pos; i++) tok[i] = (int32_t)(1 + (i * 7919) % (c->vocab_size - 1));

    /* prefill: blocks of KVS_MODEL_BLOCK positions, logits at each block's end */
    const float *lg = NULL;
    int n_blocks = 0;
    t0 = kvs_now_s();
    double c0 = cpu_seconds();
    for (int p = 0; p < n_prompt; p += KVS_MODEL_BLOCK, n_blocks++) {
        int nb = n_prompt - p < KVS_MODEL_BLOCK ? n_prompt - p : KVS_MODEL_BLOCK;
        CHECK(kvs_model_forward_block(s, tok + p, nb, p, &lg));
    }
    double t_pre = kvs_now_s() - t0, cpu_pre = cpu_seconds() - c0;
    /* matrix-product FLOPs: every projection of every prompt position, the classifier once per block */
    double per_pos = L * (qd * d + 2 * kvd * d + d * qd + 3 * hid * d);
    double mat_flops = 2.0 * (per_pos * n_prompt + V * d * n_blocks);
    /* attention (not a matrix product of weights; reported apart): q.k and p.v over the causal triangle */
    double attn_flops = 2.0 * 2.0 * L * c->n_heads * c->head_dim * ((double)n_prompt * (n_prompt + 1) / 2);

    /* decode: token by token after the prompt */
    t0 = kvs_now_s();
    c0 = cpu_seconds();
    for (int p = n_prompt; p < max_pos; p++) CHECK(kvs_model_forward(s, tok[p], p, &lg));
    double t_dec = kvs_now_s() - t0, cpu_dec = cpu_seconds() - c0;
    double dec_tps = n_dec / t_dec;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double rss = (double)ru.ru_maxrss * 1024.0;
    loadavg(load1, sizeof load1);

    /* each product of a decode step alone, over all layers (so that its weights come from memory), best of 3:
     * its weight bytes / time, against the read bandwidth below */
    static const char *const prod_name[5] = {"q/k/v", "o", "gate/up", "down", "classifier"};
    double prod_bps[5] = {0};
    {
        size_t big = (size_t)(hid > V ? hid : V);
        float *xv = calloc(big, sizeof *xv), *yv[3] = {calloc(big, sizeof(float)), calloc(big, sizeof(float)),
                                                      calloc(big, sizeof(float))};
        if (!xv || !yv[0] || !yv[1] || !yv[2]) return 1;
        for (size_t i = 0; i < big; i++) xv[i] = 1e-3f * (float)(i % 97);
        kvs_model_weights mw;
        CHECK(kvs_model_weights_get(m, &mw));
        for (int rep = 0; rep < 3; rep++)
            for (int k = 0; k < 5; k++) {
                double bytes = 0, t = kvs_now_s();
                for (int l = 0; l < (k == 4 ? 1 : c->n_layers); l++) {
                    kvs_model_layer_weights lw;
                    CHECK(kvs_model_layer_weights_get(m, l, &lw));
                    int id = (int)d, iq = (int)qd, ik = (int)kvd, ih = (int)hid;
                    if (k == 0) {
                        kvs_gemm_out o[3] = {{lw.wq, NULL, yv[0], 0, iq}, {lw.wk, NULL, yv[1], 0, ik},
                                             {lw.wv, NULL, yv[2], 0, ik}};
                        kvs_gemm_multi(pool, xv, 0, 1, id, o, 3);
                        bytes += 2.0 * (qd + 2 * kvd) * d;
                    } else if (k == 1) {
                        kvs_gemm(pool, xv, 0, 1, iq, lw.wo, NULL, id, yv[0], 0);
                        bytes += 2.0 * d * qd;
                    } else if (k == 2) {
                        kvs_gemm_out o[2] = {{lw.w1, NULL, yv[0], 0, ih}, {lw.w3, NULL, yv[1], 0, ih}};
                        kvs_gemm_multi(pool, xv, 0, 1, id, o, 2);
                        bytes += 2.0 * 2 * hid * d;
                    } else if (k == 3) {
                        kvs_gemm(pool, xv, 0, 1, ih, lw.w2, NULL, id, yv[0], 0);
                        bytes += 2.0 * d * hid;
                    } else {
                        kvs_gemm(pool, xv, 0, 1, id, mw.cls, NULL, (int)V, yv[0], 0);
                        bytes += 2.0 * V * d;
                    }
                }
                double bps = bytes / (kvs_now_s() - t);
                if (bps > prod_bps[k]) prod_bps[k] = bps;
            }
        free(xv);
        for (int i = 0; i < 3; i++) free(yv[i]);
    }
    kvs_model_state_free(s);
    kvs_model_free(m);
    free(tok);
    kvs_threadpool_free(pool);

    /* the machine's ceilings, measured now that the model's memory is gone */
    double fma = 0;
    kvs_peak_isa best = KVS_PEAK_SSE2;
    for (int i = 0; i < KVS_PEAK_COUNT; i++) {
        if (!kvs_peak_isa_available((kvs_peak_isa)i)) continue;
        double f = kvs_peak_fma((kvs_peak_isa)i, nt, 0.5);
        if (f > fma) {
            fma = f;
            best = (kvs_peak_isa)i;
        }
    }
    double fma1 = 0; /* one core, best of 5 short probes: the yardstick of the FLOP per CPU-second */
    for (int i = 0; i < 5; i++) {
        double f = kvs_peak_fma(best, 1, 0.2);
        if (f > fma1) fma1 = f;
    }
    double bw = kvs_peak_read_bandwidth((size_t)1 << 30, nt, 3);
    double peak_flops = 2.0 * fma;
    double wbytes = (double)info->weight_bytes;
    double floor_tps = bw / wbytes;

    struct utsname u;
    uname(&u);
    printf("machine: %s, %d threads of %d CPUs, %s; GEMM kernels %s; load average %s before, %s after the model "
           "runs\n", cpu, nt, kvs_n_cpus(), u.machine, kvs_gemm_isa_name(kvs_gemm_isa_get()), load0, load1);
    printf("checkpoint: %s (random bf16 weights, speed only; %.2f GB, %.3g parameters), written/found in %.1f s\n",
           BENCH_DIR, ckpt_bytes / 1e9, (double)info->n_params, t_gen);
    printf("\n| measurement | value | yardstick | ratio |\n|---|---|---|---|\n");
    printf("| prefill %d tokens (blocks of %d) | %.2f s, %.0f tok/s | matrix products %.3g FLOP: %.1f GFLOP/s vs "
           "all-core fp32 FMA peak %.1f GFLOP/s (%s, %d threads) | **%.0f%%** of peak |\n",
           n_prompt, KVS_MODEL_BLOCK, t_pre, n_prompt / t_pre, mat_flops, mat_flops / t_pre / 1e9, peak_flops / 1e9,
           kvs_peak_isa_name(best), nt, 100.0 * mat_flops / t_pre / peak_flops);
    printf("| (attention in the prefill, apart) | %.3g FLOP | %.1f%% of the matrix FLOPs | |\n", attn_flops,
           100.0 * attn_flops / mat_flops);
    printf("| (CPU time the prefill had) | %.1f CPU-s in %.1f s | %d threads | %.0f%% of the cores' time |\n", cpu_pre,
           t_pre, nt, 100.0 * cpu_pre / (t_pre * nt));
    printf("| (prefill per CPU-second) | %.1f GFLOP per CPU-s | one core's fp32 FMA rate %.1f GFLOP/s | %.0f%% |\n",
           mat_flops / cpu_pre / 1e9, 2.0 * fma1 / 1e9, 100.0 * mat_flops / cpu_pre / (2.0 * fma1));
    printf("| decode %d tokens after the prompt | %.2f tok/s (%.1f ms/token) | 16-bit weight-bandwidth floor %.2f "
           "tok/s = read bandwidth %.1f GB/s / %.2f GB of weights per token | **%.0f%%** of floor |\n",
           n_dec, dec_tps, 1e3 / dec_tps, floor_tps, bw / 1e9, wbytes / 1e9, 100.0 * dec_tps / floor_tps);
    printf("| (CPU time the decode had) | %.1f CPU-s in %.1f s | %d threads | %.0f%% of the cores' time |\n", cpu_dec,
           t_dec, nt, 100.0 * cpu_dec / (t_dec * nt));
    printf("| (decode products alone, weight bytes / time) |");
    for (int k = 0; k < 5; k++) printf("%s %s %.1f GB/s", k ? "," : "", prod_name[k], prod_bps[k] / 1e9);
    printf(" | read bandwidth %.1f GB/s |", bw / 1e9);
    for (int k = 0; k < 5; k++) printf("%s %.0f%%", k ? "," : "", 100.0 * prod_bps[k] / bw);
    printf(" |\n");
    printf("| peak RSS | %.2f GB | checkpoint %.2f GB + KV cache %.2f GB (fp32, %d positions) = %.2f GB | **%.2fx** |\n",
           rss / 1e9, ckpt_bytes / 1e9, kv_bytes / 1e9, max_pos, (ckpt_bytes + kv_bytes) / 1e9,
           rss / (ckpt_bytes + kv_bytes));
    printf("| model load + first state | %.2f s | 16-bit matrices packed into panels (%.2f GB), their mapped pages dropped | |\n",
           t_load, wbytes / 1e9);
    return 0;
}
