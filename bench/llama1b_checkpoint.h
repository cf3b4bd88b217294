/* llama1b_checkpoint.h — the Llama-3.2-1B-shaped random bf16 Hugging Face folder that bench_cuda.c (the CUDA
 * backend) and bench_prefill.c (the CPU blocked prefill and 16-bit decode) measure on: written once into /tmp,
 * reused by later runs. Random weights: speed only, its text is noise. Header-only (static functions): each bench
 * is one source file (Makefile $(BUILD)/bench/%).
 */
#ifndef KVS_BENCH_LLAMA1B_CHECKPOINT_H
#define KVS_BENCH_LLAMA1B_CHECKPOINT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/kvs.h"

/* The folder (BENCH_DIR) and its shape (B_*): Llama-3.2-1B-like with a 32000 vocabulary: 16 layers, dim 2048,
 * FFN 8192, 32 heads, 8 KV heads, head_dim 64, tied embeddings: 1.04e9 parameters. */
enum { B_DIM = 2048, B_HID = 8192, B_LAYERS = 16, B_HEADS = 32, B_KV = 8, B_VOCAB = 32000, B_CTX = 4096 };
#define BENCH_DIR "/tmp/kvsim_bench_cuda_1b"

static uint64_t rng = 0x2545F4914F6CDD1Dull;

/* bf16 of a uniform value in [-a, a) (std a/sqrt(3)); xorshift64*, fast enough for 1e9 values */
static inline uint16_t rand_bf16(float a) {
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

static inline int tensor_list(tensor_desc *t) {
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
static inline void write_checkpoint(void) {
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

#endif /* KVS_BENCH_LLAMA1B_CHECKPOINT_H */
