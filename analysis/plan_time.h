/* plan_time.h — time in a capacity plan: a roofline per phase (prefill, decode) on a named GPU, from the model's
 * shape (analysis/plan.h) and a policy's footprint, nominal or MEASURED by kvsim replay (its storage, read traffic
 * and host transfers). `kvsim plan --hw` prints it (../shared/DESIGN.md "Analysis: capacity planning").
 *
 * The model, per GPU of N (tensor parallel: weights, query and KV heads split N ways, Megatron-LM's layout), for a
 * model of L layers, hidden h, H query heads of head_dim d, W weight bytes, Pm matrix-product parameters (every
 * weight matrix, the classifier included; not the token embedding of an untied model, a row lookup):
 *
 *   prefill of b prompts of P tokens (time to first token, one batch of b arriving together):
 *     FLOPs  = b · [2 · Pm · P  +  L · H · 2 · d · P · (P + 1)]       (matmuls; causal QK^T and PV: 4·d per
 *                                                                     attended pair, P(P+1)/2 pairs per head)
 *     bytes  = W + b · P · L · A · act_bytes                           (weights once; each matmul's input and
 *              A = 4h + 2·q + 2·kv + 3·f elements per token per layer  output once: q,k,v, o, gate+up, down)
 *     t = max(FLOPs / (N · F · mfu), bytes / (N · BW · mbu)) + comm(b · P)
 *   decode step at batch b, every sequence at length n (time per output token):
 *     FLOPs  = b · [2 · Pm  +  L · H · 4 · d · attended(n)]
 *     bytes  = W + b · L · n_kv · (reads_kv(n) + reads_aux(n))         (weights once per step; each sequence's
 *                                                                     K/V and auxiliary reads, kvs_plan_reads_at)
 *     t = max(FLOPs / (N · F · mfu), bytes / (N · BW · mbu)) + pcie + comm(b)
 *     pcie = b · L · n_kv · transfer(n) / (N · host BW)               (an offloading policy's host<->device
 *                                                                     tokens: on the critical path, not overlapped)
 *   comm(t tokens) = 2 · L all-reduces of t · h · act_bytes bytes, each 2 (N-1)/N · S / link BW (a ring; Megatron
 *     has one after attention and one after the MLP of every layer); 0 for N = 1. Latency per message not counted.
 *   Sliding-window layers (kvs_plan_model.window / window_layers; Gemma-3's local layers, `kvsim plan --window`):
 *     such a layer attends min(p + 1, W) positions at position p, so its prefill pairs are W (W + 1)/2 + (P - W) W
 *     past W (P (P + 1)/2 up to it), and a decode step's K/V read and attended positions are capped at the full
 *     cache's of min(n, W) positions (kvs_plan_reads_windowed); the sums above run over the layers, full and
 *     windowed, and a phase's per-layer figures are the mean layer's.
 *   Per layer: the same with one layer's weights (kvs_plan_layer_params), its attention and its share of the reads,
 *   transfers and all-reduces; the rest of the total is the classifier (and, read once per step, the embedding).
 *   TPOT = the mean step time over the response (n = P+1 .. P+R, sampled at up to 256 evenly spaced steps);
 *   tokens/s = b / TPOT (decode throughput). The KV heads split N ways assumes N divides n_kv (else each GPU holds
 *   ceil(n_kv / N), which the time counts).
 * F is the dense tensor throughput of the weights' type (fp8 weights: the fp8 rate when the GPU has one; else
 * fp16/bf16), BW the HBM bandwidth, mbu / mfu efficiency factors in (0, 1] (default 1: the roofline bound, what
 * the hardware allows at best; the documentation's published comparisons give the factors real servers reach).
 * Activations are act_bytes = 2 (16-bit). Not modelled: kernel launch and scheduling overheads, the policy's own
 * scoring compute (a prefill-time selection such as SnapKV's), overlap of transfers with compute, paging.
 */
#ifndef KVS_ANALYSIS_PLAN_TIME_H
#define KVS_ANALYSIS_PLAN_TIME_H

#include <stdint.h>

#include "plan.h"

/* A GPU's published figures (per GPU). */
typedef struct {
    char name[48];
    char source[256];   /* where the figures come from (datasheet) */
    double mem_bytes;   /* memory, bytes (the datasheet's GB = 10^9 bytes) */
    double hbm_bw;      /* memory bandwidth, bytes/s */
    double flops16;     /* dense fp16/bf16 tensor throughput, FLOP/s (no sparsity) */
    double flops8;      /* dense fp8 tensor throughput, FLOP/s; 0 = none (the fp16 rate is used) */
    double host_bw;     /* host<->device bandwidth per direction, bytes/s (PCIe; NVLink-C2C on Grace parts) */
    double link_bw;     /* GPU<->GPU bandwidth per direction per GPU, bytes/s (NVLink, Infinity Fabric; PCIe when
                         * the part has no GPU link) */
} kvs_plan_hw;

/*! kvs_plan_hw_count() / kvs_plan_hw_at() : the built-in GPU presets, in listing order. */
int kvs_plan_hw_count(void);
const kvs_plan_hw *kvs_plan_hw_at(int i);

/*! kvs_plan_hw_find() : the preset named `name` (case-insensitive) into *out; KVS_ERR_INVALID_ARG "unknown GPU
 *  'X' (kvsim plan --list-hw lists them; --hw FILE.json describes another)". */
kvs_status kvs_plan_hw_find(const char *name, kvs_plan_hw *out);

/*! kvs_plan_hw_from_file() : a GPU from a JSON file: {"name": "...", "memory_gb": 80, "hbm_tb_s": 3.35,
 *  "bf16_tflops": 989, "fp8_tflops": 1979 (optional, 0 = none), "host_gb_s": 64, "link_gb_s": 450 (optional:
 *  host_gb_s)}; units: GB = 10^9 bytes, TB/s = 10^12 bytes/s, TFLOPS = 10^12 FLOP/s, bandwidths per direction.
 *  KVS_ERR_IO unreadable; KVS_ERR_FORMAT malformed or a required field missing or not positive (named). */
kvs_status kvs_plan_hw_from_file(const char *path, kvs_plan_hw *out);

/*! kvs_plan_hw_resolve() : a preset name, else a JSON file path (kvs_plan_hw_from_file). */
kvs_status kvs_plan_hw_resolve(const char *name_or_path, kvs_plan_hw *out);

/* The time of one phase. */
typedef struct {
    double flops, bytes;        /* in total over the GPUs */
    double layer_flops, layer_bytes; /* one transformer layer's share, in total over the GPUs (its weights
                                 * kvs_plan_layer_params x weight bytes; its K/V and auxiliary reads; its activations) */
    double layer_seconds;       /* one layer: max(its compute, its memory) + its share of transfers and all-reduces */
    double t_compute, t_memory; /* seconds, per GPU at the efficiency factors */
    double t_pcie, t_comm;      /* seconds: host transfers (decode), all-reduces */
    double seconds;             /* max(t_compute, t_memory) + t_pcie + t_comm */
    int compute_bound;          /* 1: t_compute > t_memory */
} kvs_plan_phase;

/* What the roofline needs besides the plan's setup. */
typedef struct {
    kvs_plan_hw hw;
    double mbu, mfu;            /* efficiency factors in (0, 1] */
} kvs_plan_time_setup;

/*! kvs_plan_matmul_params() : Pm, the parameters of the matrix products (kvs_plan_params less an untied token
 *  embedding, vocab · hidden, and OPT's learned positions). */
double kvs_plan_matmul_params(const kvs_plan_model *m);

/*! kvs_plan_layer_params() : the parameters of one transformer layer (kvs_plan_params less the token embedding,
 *  the classifier when untied, the final norm and OPT's learned positions and final LayerNorm, over n_layers). The
 *  rest of a phase's time is the classifier's and the embedding's. */
double kvs_plan_layer_params(const kvs_plan_model *m);

/*! kvs_plan_prefill() : the prefill of `batch` prompts of `prompt` tokens (header formulas). */
kvs_plan_phase kvs_plan_prefill(const kvs_plan_setup *s, const kvs_plan_time_setup *t, int64_t prompt, int64_t batch);

/*! kvs_plan_decode_step() : one decode step of `pol` at batch `batch`, every sequence (prompt P) at length n. */
kvs_plan_phase kvs_plan_decode_step(const kvs_plan_setup *s, const kvs_plan_time_setup *t, const kvs_plan_policy *pol,
                                    int64_t prompt, int64_t n, int64_t batch);

/* Latency and throughput of one (policy, context, response, batch). */
typedef struct {
    int64_t batch;
    double ttft;              /* seconds: the prefill of the batch's prompts */
    double tpot;              /* seconds: mean decode step over the response */
    double tokens_per_s;      /* batch / tpot */
    int prefill_compute_bound, decode_compute_bound; /* decode: at the response's last step */
    kvs_plan_phase prefill;   /* the prefill (ttft = prefill.seconds) */
    kvs_plan_phase last_step; /* the decode step at the response's end (n = P + max(R, 1)) */
} kvs_plan_timing;

/*! kvs_plan_time() : the timing of `pol` at (context >= 1, response >= 0, batch >= 1); a response of 0 is timed
 *  as one step. KVS_ERR_INVALID_ARG for a bad point, an efficiency factor outside (0, 1] or a GPU without
 *  bandwidth or throughput. */
kvs_status kvs_plan_time(const kvs_plan_setup *s, const kvs_plan_time_setup *t, const kvs_plan_policy *pol,
                         int64_t context, int64_t response, int64_t batch, kvs_plan_timing *out);

#endif /* KVS_ANALYSIS_PLAN_TIME_H */
