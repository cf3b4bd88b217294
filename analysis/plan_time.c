/* plan_time.c — the roofline of a capacity plan (see plan_time.h): GPU presets with their published figures, GPU
 * files, and the prefill and decode times of a policy's footprint. Follows ../shared/DESIGN.md "Analysis".
 */
#include "plan_time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../common/json.h"

/* ------------------------------------------------------------------------------------------------
 * GPU presets. Dense tensor throughput (the datasheets print "with sparsity" figures twice the dense ones: the
 * dense half is taken). Bidirectional link figures are halved to a direction's. Memory as the datasheet says it,
 * GB = 10^9 bytes (the conservative reading: nvidia-smi shows 80 GiB on an "80GB" H100).
 * ---------------------------------------------------------------------------------------------- */

#define G 1e9
#define T 1e12

static const kvs_plan_hw gpus[] = {
    /* NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): A100 40GB SXM:
     * HBM2 1,555 GB/s; BF16 Tensor Core 312 TFLOPS (624 with sparsity); no FP8; NVLink 600 GB/s (both
     * directions); PCIe Gen4 64 GB/s (both directions) */
    {"A100-40GB-SXM", "NVIDIA A100 datasheet (SXM 40GB): 1555 GB/s, bf16 312 TFLOPS dense, NVLink 600 GB/s, PCIe4",
     40 * G, 1555 * G, 312 * T, 0, 32 * G, 300 * G},
    /* the same datasheet, A100 80GB SXM: HBM2e 2,039 GB/s, otherwise as the 40GB part */
    {"A100-80GB-SXM", "NVIDIA A100 datasheet (SXM 80GB): 2039 GB/s, bf16 312 TFLOPS dense, NVLink 600 GB/s, PCIe4",
     80 * G, 2039 * G, 312 * T, 0, 32 * G, 300 * G},
    /* NVIDIA H100 Tensor Core GPU datasheet: H100 SXM: 80GB, 3.35 TB/s; BF16 1,979 TFLOPS and FP8 3,958 TFLOPS
     * with sparsity (989.5 / 1,979 dense); NVLink 900 GB/s; PCIe Gen5 128 GB/s (both directions) */
    {"H100-SXM", "NVIDIA H100 datasheet (SXM): 3.35 TB/s, bf16 989.5 / fp8 1979 TFLOPS dense, NVLink 900 GB/s, PCIe5",
     80 * G, 3.35 * T, 989.5 * T, 1979 * T, 64 * G, 450 * G},
    /* the H100 datasheet, H100 PCIe: 80GB, 2.0 TB/s; BF16 1,513 and FP8 3,026 TFLOPS with sparsity (756.5 / 1,513
     * dense); NVLink bridge 600 GB/s; PCIe Gen5 128 GB/s */
    {"H100-PCIe", "NVIDIA H100 datasheet (PCIe): 2.0 TB/s, bf16 756.5 / fp8 1513 TFLOPS dense, NVLink bridge 600 GB/s",
     80 * G, 2.0 * T, 756.5 * T, 1513 * T, 64 * G, 300 * G},
    /* NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141GB HBM3e, 4.8 TB/s; BF16 1,979 / FP8 3,958 TFLOPS with
     * sparsity (989.5 / 1,979 dense); NVLink 900 GB/s; PCIe Gen5 128 GB/s */
    {"H200", "NVIDIA H200 datasheet (SXM): 141 GB, 4.8 TB/s, bf16 989.5 / fp8 1979 TFLOPS dense, NVLink 900 GB/s",
     141 * G, 4.8 * T, 989.5 * T, 1979 * T, 64 * G, 450 * G},
    /* NVIDIA L40S datasheet: 48GB GDDR6, 864 GB/s; BF16 362.05 TFLOPS (733 with sparsity), FP8 733 (1,466 with
     * sparsity); PCIe Gen4 x16 64 GB/s (both directions); no NVLink (GPU to GPU over PCIe) */
    {"L40S", "NVIDIA L40S datasheet: 48 GB, 864 GB/s, bf16 362.05 / fp8 733 TFLOPS dense, PCIe4, no NVLink", 48 * G,
     864 * G, 362.05 * T, 733 * T, 32 * G, 32 * G},
    /* NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: 24GB GDDR6X, 1,008 GB/s; peak FP16/BF16 tensor
     * with FP32 accumulate 165.2 TFLOPS dense, FP8 with FP32 accumulate 330.3 dense (the accumulation frameworks
     * use; FP16 accumulate doubles both); PCIe Gen4 x16; no NVLink */
    {"RTX-4090", "NVIDIA Ada architecture whitepaper (RTX 4090): 24 GB, 1008 GB/s, bf16 165.2 / fp8 330.3 TFLOPS "
                 "dense (fp32 accumulate), PCIe4",
     24 * G, 1008 * G, 165.2 * T, 330.3 * T, 32 * G, 32 * G},
    /* AMD Instinct MI300X data sheet: 192GB HBM3, 5.3 TB/s; FP16/BF16 1,307.4 TFLOPS dense (2,614.9 with
     * sparsity), FP8 2,614.9 dense; 7 Infinity Fabric links of 128 GB/s (both directions): 448 GB/s per direction
     * in all; PCIe Gen5 x16 128 GB/s */
    {"MI300X", "AMD Instinct MI300X data sheet: 192 GB, 5.3 TB/s, bf16 1307.4 / fp8 2614.9 TFLOPS dense, Infinity "
               "Fabric 7 x 128 GB/s, PCIe5",
     192 * G, 5.3 * T, 1307.4 * T, 2614.9 * T, 64 * G, 448 * G},
};

int kvs_plan_hw_count(void) { return (int)(sizeof gpus / sizeof gpus[0]); }

const kvs_plan_hw *kvs_plan_hw_at(int i) { return i >= 0 && i < kvs_plan_hw_count() ? &gpus[i] : NULL; }

kvs_status kvs_plan_hw_find(const char *name, kvs_plan_hw *out) {
    if (!name || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL GPU name");
    for (int i = 0; i < kvs_plan_hw_count(); i++)
        if (!strcasecmp(gpus[i].name, name)) {
            *out = gpus[i];
            return KVS_OK;
        }
    return kvs_fail(KVS_ERR_INVALID_ARG, "unknown GPU '%s' (kvsim plan --list-hw lists them; --hw FILE.json describes "
                                         "another)", name);
}

/* A positive number field; `optional`: absent (or null) leaves *out as it is. */
static kvs_status hw_num(const kvs_json *o, const char *file, const char *key, int optional, double scale,
                         double *out) {
    const kvs_json *v = kvs_json_get(o, key);
    if (!v || kvs_json_type_of(v) == KVS_JSON_NULL) {
        if (optional) return KVS_OK;
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s is missing", file, key);
    }
    double d = kvs_json_number(v);
    if (kvs_json_type_of(v) != KVS_JSON_NUMBER || !isfinite(d) || d < 0 || (!optional && !(d > 0)))
        return kvs_fail(KVS_ERR_FORMAT, "%s: %s must be a %s number", file, key, optional ? "non-negative" : "positive");
    *out = d * scale;
    return KVS_OK;
}

kvs_status kvs_plan_hw_from_file(const char *path, kvs_plan_hw *out) {
    if (!path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL GPU file");
    char *text = NULL;
    size_t len = 0;
    kvs_status st = kvs_read_file(path, &text, &len);
    if (st != KVS_OK) return st;
    kvs_json *o = NULL;
    st = kvs_json_parse(text, len, &o);
    free(text);
    if (st != KVS_OK) return kvs_fail(st, "%s: %s", path, kvs_last_error());
    kvs_plan_hw h = {0};
    if (kvs_json_type_of(o) != KVS_JSON_OBJECT) {
        st = kvs_fail(KVS_ERR_FORMAT, "%s: not a JSON object", path);
        goto cleanup;
    }
    KVS_TRY(st = hw_num(o, path, "memory_gb", 0, G, &h.mem_bytes));
    KVS_TRY(st = hw_num(o, path, "hbm_tb_s", 0, T, &h.hbm_bw));
    KVS_TRY(st = hw_num(o, path, "bf16_tflops", 0, T, &h.flops16));
    KVS_TRY(st = hw_num(o, path, "fp8_tflops", 1, T, &h.flops8));
    KVS_TRY(st = hw_num(o, path, "host_gb_s", 0, G, &h.host_bw));
    h.link_bw = h.host_bw;
    KVS_TRY(st = hw_num(o, path, "link_gb_s", 1, G, &h.link_bw));
    const char *name = kvs_json_string(kvs_json_get(o, "name"));
    snprintf(h.name, sizeof h.name, "%.*s", (int)sizeof h.name - 1, name && name[0] ? name : kvs_path_base(path));
    snprintf(h.source, sizeof h.source, "%.*s", (int)sizeof h.source - 1, path);
    *out = h;
cleanup:
    kvs_json_free(o);
    return st;
}

kvs_status kvs_plan_hw_resolve(const char *name_or_path, kvs_plan_hw *out) {
    if (!name_or_path || !out) return kvs_fail(KVS_ERR_INVALID_ARG, "plan: NULL GPU");
    for (int i = 0; i < kvs_plan_hw_count(); i++)
        if (!strcasecmp(gpus[i].name, name_or_path)) {
            *out = gpus[i];
            return KVS_OK;
        }
    if (!strchr(name_or_path, '/') && !strchr(name_or_path, '.')) /* a name, not a file */
        return kvs_plan_hw_find(name_or_path, out);
    return kvs_plan_hw_from_file(name_or_path, out);
}

/* ------------------------------------------------------------------------------------------------
 * The roofline
 * ---------------------------------------------------------------------------------------------- */

#define ACT_BYTES 2.0 /* 16-bit activations */

double kvs_plan_matmul_params(const kvs_plan_model *m) {
    double p = kvs_plan_params(m);
    if (m->tied_embeddings != 1) p -= (double)m->vocab * m->hidden; /* the token embedding: a lookup */
    if (m->arch == KVS_PLAN_ARCH_OPT) p -= ((double)m->max_positions + 2) * m->hidden; /* learned positions */
    return p;
}

double kvs_plan_layer_params(const kvs_plan_model *m) {
    const double h = m->hidden, v = m->vocab;
    double rest = v * h * (m->tied_embeddings == 1 ? 1 : 2) + h; /* embedding, classifier, the final norm */
    if (m->arch == KVS_PLAN_ARCH_OPT) /* and the learned positions, the final LayerNorm's weight and bias */
        rest = v * h * (m->tied_embeddings == 1 ? 1 : 2) + ((double)m->max_positions + 2) * h + 2 * h;
    return m->n_layers > 0 ? (kvs_plan_params(m) - rest) / m->n_layers : 0;
}

static double gpus_of(const kvs_plan_setup *s) { return s->n_gpus > 0 ? s->n_gpus : 1; }

/* The fraction of the KV heads one GPU holds: ceil(n_kv / N) of n_kv (a KV head is not split). */
static double kv_share(const kvs_plan_setup *s) {
    const double N = gpus_of(s), kv = s->model.n_kv_heads;
    return ceil(kv / N) / kv;
}

/* Dense throughput of the weights' type: fp8 weights run at the fp8 rate where the GPU has one. */
static double flops_rate(const kvs_plan_setup *s, const kvs_plan_hw *h) {
    return s->weight_elem_bytes == 1 && h->flops8 > 0 ? h->flops8 : h->flops16;
}

/* 2 L ring all-reduces of `tokens` activations of width hidden, per GPU. */
static double comm_time(const kvs_plan_setup *s, const kvs_plan_hw *h, double tokens) {
    const double N = gpus_of(s);
    if (N <= 1 || !(h->link_bw > 0)) return 0;
    const double bytes = tokens * s->model.hidden * ACT_BYTES;
    return 2.0 * s->model.n_layers * 2.0 * (N - 1) / N * bytes / h->link_bw;
}

static void finish(kvs_plan_phase *ph, const kvs_plan_setup *s, const kvs_plan_time_setup *t) {
    const double N = gpus_of(s), F = N * flops_rate(s, &t->hw) * t->mfu, BW = N * t->hw.hbm_bw * t->mbu;
    ph->t_compute = ph->flops / F;
    ph->t_memory = ph->bytes / BW;
    ph->compute_bound = ph->t_compute > ph->t_memory;
    ph->seconds = (ph->compute_bound ? ph->t_compute : ph->t_memory) + ph->t_pcie + ph->t_comm;
    const double lc = ph->layer_flops / F, lm = ph->layer_bytes / BW, L = s->model.n_layers;
    ph->layer_seconds = (lc > lm ? lc : lm) + (L > 0 ? (ph->t_pcie + ph->t_comm) / L : 0);
}

/* The layers of the model with a sliding window (analysis/plan.h kvs_plan_model.window_layers), 0 without. */
static double window_layers(const kvs_plan_model *m) { return m->window > 0 ? m->window_layers : 0; }

/* The (query, key) pairs one head attends over a causal prompt of P positions: P (P + 1) / 2 on a full layer; on a
 * sliding-window layer of window W each position p attends min(p + 1, W): W (W + 1) / 2 + (P - W) W past W. */
static double prompt_pairs(double P, double W) {
    if (W <= 0 || P <= W) return P * (P + 1) / 2;
    return W * (W + 1) / 2 + (P - W) * W;
}

kvs_plan_phase kvs_plan_prefill(const kvs_plan_setup *s, const kvs_plan_time_setup *t, int64_t prompt,
                                int64_t batch) {
    const kvs_plan_model *m = &s->model;
    const double P = (double)prompt, b = (double)batch, L = m->n_layers, d = m->head_dim;
    const double h = m->hidden, q = (double)m->n_heads * d, kv = (double)m->n_kv_heads * d, f = m->intermediate;
    /* 4 d FLOPs per attended pair (QK^T and PV), summed over the layers: full ones, then sliding-window ones */
    const double Lw = window_layers(m);
    const double pairs = (L - Lw) * prompt_pairs(P, 0) + Lw * prompt_pairs(P, m->window);
    kvs_plan_phase ph = {0};
    if (Lw > 0) {
        ph.flops = b * (2.0 * kvs_plan_matmul_params(m) * P + m->n_heads * 4.0 * d * pairs);
        ph.layer_flops = b * (2.0 * kvs_plan_layer_params(m) * P + m->n_heads * 4.0 * d * pairs / L);
    } else { /* every layer full: L (P (P + 1) / 2) pairs, written as before windows existed (the same bits) */
        ph.flops = b * (2.0 * kvs_plan_matmul_params(m) * P + L * m->n_heads * 2.0 * d * P * (P + 1));
        ph.layer_flops = b * (2.0 * kvs_plan_layer_params(m) * P + m->n_heads * 2.0 * d * P * (P + 1));
    }
    ph.bytes = kvs_plan_weight_bytes(s) + b * P * L * (4 * h + 2 * q + 2 * kv + 3 * f) * ACT_BYTES;
    ph.layer_bytes = kvs_plan_layer_params(m) * s->weight_elem_bytes +
                     b * P * (4 * h + 2 * q + 2 * kv + 3 * f) * ACT_BYTES;
    ph.t_comm = comm_time(s, &t->hw, b * P);
    finish(&ph, s, t);
    return ph;
}

kvs_plan_phase kvs_plan_decode_step(const kvs_plan_setup *s, const kvs_plan_time_setup *t, const kvs_plan_policy *pol,
                                    int64_t prompt, int64_t n, int64_t batch) {
    const kvs_plan_model *m = &s->model;
    const double b = (double)batch, L = m->n_layers;
    /* the reads summed over the layers: full ones, then sliding-window ones (capped at their window) */
    const double Lw = window_layers(m), Lf = L - Lw;
    const kvs_plan_reads r = kvs_plan_reads_at(pol, s, prompt, n);
    const kvs_plan_footprint fp = kvs_plan_footprint_at(pol, s, prompt, n);
    kvs_plan_phase ph = {0};
    /* the KV heads spread over the GPUs: the busiest GPU holds kv_share of them, N · kv_share in total */
    const double N = gpus_of(s), share = kv_share(s) * N;
    if (Lw > 0) {
        const kvs_plan_reads rw = kvs_plan_reads_windowed(pol, s, prompt, n);
        const double att = Lf * r.attended + Lw * rw.attended, reads = Lf * (r.kv + r.aux) + Lw * (rw.kv + rw.aux);
        ph.flops = b * (2.0 * kvs_plan_matmul_params(m) + m->n_heads * 4.0 * m->head_dim * att);
        ph.bytes = kvs_plan_weight_bytes(s) + b * m->n_kv_heads * share * reads;
        /* one layer: the mean layer's attention and reads (a hybrid model's full and windowed layers differ) */
        ph.layer_flops = b * (2.0 * kvs_plan_layer_params(m) + m->n_heads * 4.0 * m->head_dim * att / L);
        ph.layer_bytes = kvs_plan_layer_params(m) * s->weight_elem_bytes + b * m->n_kv_heads * share * reads / L;
    } else {
        ph.flops = b * (2.0 * kvs_plan_matmul_params(m) + L * m->n_heads * 4.0 * m->head_dim * r.attended);
        ph.bytes = kvs_plan_weight_bytes(s) + b * L * m->n_kv_heads * share * (r.kv + r.aux);
        ph.layer_flops = b * (2.0 * kvs_plan_layer_params(m) + m->n_heads * 4.0 * m->head_dim * r.attended);
        ph.layer_bytes = kvs_plan_layer_params(m) * s->weight_elem_bytes + b * m->n_kv_heads * share * (r.kv + r.aux);
    }
    ph.t_pcie = t->hw.host_bw > 0 ? b * L * m->n_kv_heads * kv_share(s) * fp.transfer / t->hw.host_bw : 0;
    ph.t_comm = comm_time(s, &t->hw, b);
    finish(&ph, s, t);
    return ph;
}

kvs_status kvs_plan_time(const kvs_plan_setup *s, const kvs_plan_time_setup *t, const kvs_plan_policy *pol,
                         int64_t context, int64_t response, int64_t batch, kvs_plan_timing *out) {
    if (!s || !t || !pol || !out || context < 1 || response < 0 || batch < 1 || s->model.n_kv_heads < 1 ||
        (pol->kind == KVS_PLAN_MEASURED && !pol->profile))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: bad time point (context >= 1, response >= 0, batch >= 1)");
    if (!(t->mbu > 0 && t->mbu <= 1) || !(t->mfu > 0 && t->mfu <= 1))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: --mbu and --mfu must be in (0, 1] (given %g, %g)", t->mbu, t->mfu);
    if (!(t->hw.hbm_bw > 0) || !(t->hw.flops16 > 0))
        return kvs_fail(KVS_ERR_INVALID_ARG, "plan: GPU '%s' has no memory bandwidth or tensor throughput",
                        t->hw.name);
    kvs_plan_timing r = {.batch = batch};
    const kvs_plan_phase pre = kvs_plan_prefill(s, t, context, batch);
    r.ttft = pre.seconds;
    r.prefill = pre;
    r.prefill_compute_bound = pre.compute_bound;
    /* step i (1..R) attends n = P + i positions (the new token's K/V included); sampled at the middle of up to
     * 256 equal slices of the response, every step when the response is shorter */
    const int64_t R = response > 0 ? response : 1, K = R < 256 ? R : 256;
    double sum = 0;
    for (int64_t k = 0; k < K; k++) {
        const int64_t i = 1 + (int64_t)(((double)k + 0.5) * (double)R / (double)K);
        sum += kvs_plan_decode_step(s, t, pol, context, context + (i > R ? R : i), batch).seconds;
    }
    r.tpot = sum / (double)K;
    r.tokens_per_s = (double)batch / r.tpot;
    r.last_step = kvs_plan_decode_step(s, t, pol, context, context + R, batch);
    r.decode_compute_bound = r.last_step.compute_bound;
    *out = r;
    return KVS_OK;
}
