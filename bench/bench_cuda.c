/* bench_cuda.c — decode speed of the CUDA capture backend (gpu_capture/cuda_backend.h) at batch 1, with and
 * without trace capture, on a Llama-shaped ~1B-parameter checkpoint with RANDOM bf16 weights (an HF folder
 * written to /tmp at run time: random weights, speed only, its text is noise), beside the memory-bandwidth
 * floor (device weight bytes per token / measured device copy bandwidth: decode of one sequence reads
 * every weight once per token) and, when python3 with torch + transformers is installed, transformers'
 * greedy generation of the same folder (eager attention, bf16) timed in the same run.
 * Built and run by `make bench-cuda`; in a build without CUDA (`make bench`) it only says it was skipped.
 * Usage: bench_cuda [steps]   (default 256 decode steps). Prints a Markdown table; nothing is asserted.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/kvs.h"
#include "gpu_capture/cuda_backend.h"
#include "gpu_capture/model.h"
#include "trace/trace.h"
#ifdef KVS_WITH_CUDA
#include "gpu_capture/cuda/cuda_testing.h"
#endif

#define CHECK(x)                                                                                          \
    do {                                                                                                  \
        kvs_status s_ = (x);                                                                              \
        if (s_ != KVS_OK) {                                                                               \
            fprintf(stderr, "bench_cuda: %s failed: %s (%s)\n", #x, kvs_strerror(s_), kvs_last_error());  \
            exit(1);                                                                                      \
        }                                                                                                 \
    } while (0)

#include "bench/llama1b_checkpoint.h"
#ifdef KVS_WITH_CUDA

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy decode of `steps` tokens from BOS; returns tokens/s of the decode steps (prefill excluded). */
static double decode(const kvs_model *m, int steps, kvs_trace_writer *w) {
    kvs_cuda_backend *b = NULL;
    const float *lg;
    int V = kvs_model_info_get(m)->config.vocab_size;
    CHECK(kvs_cuda_backend_create(m, steps + 1, w, &b));
    int32_t tok = 1;
    CHECK(kvs_cuda_backend_step(b, tok, 0, KVS_ROLE_PROMPT, 0, &lg));
    double t0 = kvs_now_s();
    for (int pos = 1; pos <= steps; pos++) {
        tok = argmax(lg, V);
        CHECK(kvs_cuda_backend_step(b, tok, pos, KVS_ROLE_GENERATED, 0, &lg));
    }
    CHECK(kvs_cuda_backend_finish(b)); /* capture: every position handed to the writer */
    double dt = kvs_now_s() - t0;
    kvs_cuda_backend_free(b);
    return steps / dt;
}

/* transformers greedy generate of the same folder (eager attention, bf16), or -1 when unavailable. */
static double transformers_tok_s(int steps) {
    if (system("python3 -c 'import torch, transformers; assert torch.cuda.is_available()' > /dev/null 2>&1") != 0)
        return -1;
    const char *script = "/tmp/kvsim_bench_cuda_hf.py";
    FILE *f = fopen(script, "w");
    if (!f) return -1;
    fprintf(f, "import time, torch, transformers\n"
               "load = transformers.AutoModelForCausalLM.from_pretrained\n"
               "try:  # transformers >= 4.56 names it dtype; older ones torch_dtype\n"
               "    m = load('%s', dtype=torch.bfloat16, attn_implementation='eager')\n"
               "except TypeError:\n"
               "    m = load('%s', torch_dtype=torch.bfloat16, attn_implementation='eager')\n"
               "m = m.cuda().eval()\n"
               "ids = torch.tensor([[1]], device='cuda')\n"
               "kw = dict(do_sample=False, min_new_tokens=%d, max_new_tokens=%d, pad_token_id=0, eos_token_id=None)\n"
               "with torch.no_grad():\n"
               "    m.generate(ids, **dict(kw, min_new_tokens=16, max_new_tokens=16))\n"
               "    torch.cuda.synchronize(); t = time.time()\n"
               "    out = m.generate(ids, **kw)\n"
               "    torch.cuda.synchronize(); dt = time.time() - t\n"
               "print('tok_s=%%.3f' %% ((out.shape[1] - 1) / dt))\n",
            BENCH_DIR, BENCH_DIR, steps, steps);
    fclose(f);
    /* its stderr goes to a log, named below when no speed comes back */
    FILE *p = popen("python3 /tmp/kvsim_bench_cuda_hf.py 2>/tmp/kvsim_bench_cuda_hf.log", "r");
    if (!p) return -1;
    char line[256];
    double v = -1;
    while (fgets(line, sizeof line, p))
        if (!strncmp(line, "tok_s=", 6)) v = atof(line + 6);
    pclose(p);
    if (v < 0) fprintf(stderr, "bench_cuda: transformers run failed; see /tmp/kvsim_bench_cuda_hf.log\n");
    return v;
}
#endif

int main(int argc, char **argv) {
#ifndef KVS_WITH_CUDA
    (void)argc;
    (void)argv;
    printf("bench_cuda: skipped: this build has no CUDA backend (run `make bench-cuda` on a machine with a GPU)\n");
    return 0;
#else
    int steps = argc > 1 ? atoi(argv[1]) : 256;
    if (steps < 1 || steps >= B_CTX) steps = 256;
    char desc[256];
    if (kvs_cuda_probe(desc, sizeof desc) != KVS_OK) {
        printf("bench_cuda: skipped: %s\n", kvs_last_error());
        return 0;
    }
    printf("device: %s\n", desc);
    double t0 = kvs_now_s();
    write_checkpoint();
    printf("checkpoint: %s (random weights, speed only), written/found in %.1f s\n", BENCH_DIR, kvs_now_s() - t0);
    kvs_model *m = NULL;
    CHECK(kvs_model_load(BENCH_DIR, &m));
    const kvs_model_info *info = kvs_model_info_get(m);
    double dev_bytes = (double)info->weight_bytes / 4.0 * (double)kvs_dtype_size(info->weight_dtype);
    double bw = 0;
    CHECK(kvs_cuda_copy_bandwidth(&bw));
    double floor_tok_s = bw / dev_bytes;

    decode(m, 16, NULL); /* warm-up: cuBLAS heuristics, clocks */
    double plain = decode(m, steps, NULL);
    char trace_path[256];
    snprintf(trace_path, sizeof trace_path, "%s/bench.kvt", BENCH_DIR);
    kvs_capture_config cc;
    memset(&cc, 0, sizeof cc);
    cc.dtype = KVS_DTYPE_F16;
    cc.block_positions = KVS_TRACE_DEFAULT_BLOCK;
    cc.max_new_tokens = steps;
    cc.flags = KVS_TRACE_FLAG_SHUFFLE;
    snprintf(cc.settings, sizeof cc.settings, "backend=cuda bench=bench_cuda random_weights=1");
    kvs_trace_writer *w = NULL;
    CHECK(kvs_trace_writer_create(trace_path, &info->config, &cc, &w));
    /* as `kvsim capture --device cuda` does: block compression on a pool of all cores but one */
    kvs_threadpool *pool = NULL;
    CHECK(kvs_threadpool_create(kvs_n_cpus() > 1 ? kvs_n_cpus() - 1 : 1, &pool));
    CHECK(kvs_trace_writer_set_threadpool(w, pool));
    double captured = decode(m, steps, w);
    CHECK(kvs_trace_writer_close(w));
    double trace_mb = (double)kvs_trace_writer_bytes(w) / 1e6;
    kvs_trace_writer_free(w);
    kvs_threadpool_free(pool);
    unlink(trace_path);
    double hf = transformers_tok_s(steps);

    printf("\nLlama-shaped checkpoint, random weights, speed only: %.2fe9 parameters, %s weights, %d decode steps "
           "from BOS, batch 1\n\n", (double)info->n_params / 1e9, kvs_dtype_name(info->weight_dtype), steps);
    printf("| what | tokens/s | ms/token | vs floor |\n|---|---:|---:|---:|\n");
    printf("| memory-bandwidth floor (%.0f MB weights / %.0f GB/s copy) | %.1f | %.3f | 100%% |\n", dev_bytes / 1e6,
           bw / 1e9, floor_tok_s, 1e3 / floor_tok_s);
    printf("| kvsim CUDA, no capture | %.1f | %.3f | %.0f%% |\n", plain, 1e3 / plain, 100 * plain / floor_tok_s);
    printf("| kvsim CUDA, capture (fp16 trace, %.1f MB) | %.1f | %.3f | %.0f%% |\n", trace_mb, captured, 1e3 / captured,
           100 * captured / floor_tok_s);
    if (hf > 0)
        printf("| transformers generate (eager, bf16) | %.1f | %.3f | %.0f%% |\n", hf, 1e3 / hf, 100 * hf / floor_tok_s);
    else
        printf("| transformers generate (eager, bf16) | not run: python3 with torch+transformers+CUDA not found | | |\n");
    printf("\ncapture overhead: %.1f%%\n", 100.0 * (plain / captured - 1.0));
    kvs_model_free(m);
    return 0;
#endif
}
