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

/* Llama-3.2-1B-like shape with a 32000 vocabulary: 16 layers, dim 2048, FFN 8192, 32 heads, 8 KV heads,
 * head_dim 64, tied embeddings: 1.04e9 parameters. */
enum { B_DIM = 2048, B_HID = 8192, B_LAYERS = 16, B_HEADS = 32, B_KV = 8, B_VOCAB = 32000, B_CTX = 4096 };
#define BENCH_DIR "/tmp/kvsim_bench_cuda_1b"

#ifdef KVS_WITH_CUDA
static uint64_t rng = 0x2545F4914F6CDD1Dull;

/* bf16 of a uniform value in [-a, a) (std a/sqrt(3)); xorshift64*, fast enough for 1e9 values */
static uint16_t rand_bf16(float a) {
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    uint64_t r = rng * 2685821657736338717ull;
    float u = (float)((r >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
    return kvs_f32_to_bf16(u * a);
}

typedef struct {
    char name[96];
    uint64_t rows, cols; /* cols 0: a vector */
    int is_norm;
} tensor_desc;

static int tensor_list(tensor_desc *t) {
    int n = 0;
    snprintf(t[n].name, sizeof t[n].name, "model.embed_tokens.weight");
    t[n].rows = B_VOCAB, t[n].cols = B_DIM, t[n++].is_norm = 0;
    snprintf(t[n].name, sizeof t[n].name, "model.norm.weight");
    t[n].rows = B_DIM, t[n].cols = 0, t[n++].is_norm = 1;
    for (int l = 0; l < B_LAYERS; l++) {
        struct { const char *s; uint64_t r, c; int norm; } L[] = {
            {"input_layernorm.weight", B_DIM, 0, 1}, {"post_attention_layernorm.weight", B_DIM, 0, 1},
            {"self_attn.q_proj.weight", B_DIM, B_DIM, 0}, {"self_attn.k_proj.weight", B_KV * 64, B_DIM, 0},
            {"self_attn.v_proj.weight", B_KV * 64, B_DIM, 0}, {"self_attn.o_proj.weight", B_DIM, B_DIM, 0},
            {"mlp.gate_proj.weight", B_HID, B_DIM, 0}, {"mlp.up_proj.weight", B_HID, B_DIM, 0},
            {"mlp.down_proj.weight", B_DIM, B_HID, 0},
        };
        for (size_t i = 0; i < sizeof L / sizeof L[0]; i++) {
            snprintf(t[n].name, sizeof t[n].name, "model.layers.%d.%s", l, L[i].s);
            t[n].rows = L[i].r, t[n].cols = L[i].c, t[n++].is_norm = L[i].norm;
        }
    }
    return n;
}

/* Writes BENCH_DIR/config.json and model.safetensors (bf16, random) unless already there. */
static void write_checkpoint(void) {
    char path[256];
    struct stat st;
    snprintf(path, sizeof path, "%s/model.safetensors", BENCH_DIR);
    if (stat(path, &st) == 0 && st.st_size > 2000000000) return;
    mkdir(BENCH_DIR, 0755);
    char cfg[256];
    snprintf(cfg, sizeof cfg, "%s/config.json", BENCH_DIR);
    FILE *f = fopen(cfg, "w");
    if (!f) { perror(cfg); exit(1); }
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %d, "
               "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
               "\"num_key_value_heads\": %d, \"head_dim\": 64, \"vocab_size\": %d, \"max_position_embeddings\": %d, "
               "\"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": true, "
               "\"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}\n",
            B_DIM, B_HID, B_LAYERS, B_HEADS, B_KV, B_VOCAB, B_CTX);
    fclose(f);
    static tensor_desc t[2 + 9 * B_LAYERS];
    int n = tensor_list(t);
    size_t cap = 1 << 20, len = 0;
    char *hdr = malloc(cap);
    if (!hdr) exit(1);
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t count = t[i].rows * (t[i].cols ? t[i].cols : 1), bytes = 2 * count;
        if (t[i].cols)
            len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu,%llu],"
                                    "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name,
                                    (unsigned long long)t[i].rows, (unsigned long long)t[i].cols,
                                    (unsigned long long)off, (unsigned long long)(off + bytes));
        else
            len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%llu],"
                                    "\"data_offsets\":[%llu,%llu]}", i ? "," : "", t[i].name,
                                    (unsigned long long)t[i].rows, (unsigned long long)off,
                                    (unsigned long long)(off + bytes));
        off += bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8) hdr[len++] = ' ';
    f = fopen(path, "wb");
    if (!f) { perror(path); exit(1); }
    uint8_t l8[8];
    kvs_put_u64(l8, len);
    fwrite(l8, 1, 8, f);
    fwrite(hdr, 1, len, f);
    size_t chunk = (size_t)1 << 22;
    uint16_t *buf = malloc(chunk * 2);
    if (!buf) exit(1);
    for (int i = 0; i < n; i++) {
        uint64_t count = t[i].rows * (t[i].cols ? t[i].cols : 1);
        /* uniform with std 0.02 for matrices (as HF initialisers), ones for norms */
        for (uint64_t done = 0; done < count;) {
            size_t k = count - done < chunk ? (size_t)(count - done) : chunk;
            for (size_t j = 0; j < k; j++) buf[j] = t[i].is_norm ? kvs_f32_to_bf16(1.0f) : rand_bf16(0.0346f);
            if (fwrite(buf, 2, k, f) != k) { perror(path); exit(1); }
            done += k;
        }
    }
    if (fclose(f)) { perror(path); exit(1); }
    free(buf);
    free(hdr);
}

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
